"""Reading what ``--compare`` prints: the rows of its side-by-side tables."""


def table_rows(stdout, title=None):
    """The rows of the first side-by-side table, or of the first one after the line ``title``."""
    lines = stdout.splitlines()
    after = 0 if title is None else lines.index(title)
    start = next(i for i, line in enumerate(lines) if i >= after and line.startswith(" ") and "| stock" in line)
    rows = {}
    for line in lines[start + 2 :]:
        if "|" not in line:
            break
        cells = [c.strip() for c in line.split("|")]
        rows[cells[0]] = cells[1:]
    return rows
