"""The patch engine under faults and threads: an undo that fails does not stop the others, an
interrupt (Ctrl-C in a notebook) while a target patches leaves nothing half-applied and nothing
claimed, and ``patch_torch()`` racing the first import of a patched module in another thread
finishes instead of deadlocking. Each case runs in a fresh interpreter with targets of its own
(a deadlock fails the test by its time-out instead of hanging the suite)."""

from __future__ import annotations

import json
import textwrap
import types

from nanopatch import engine

from conftest import run_python

PRELUDE = """
import json, sys, types
import nanopatch
from nanopatch import engine

def target(name, module, patch, option="vision"):
    code = types.ModuleType(f"patcher_{name}")
    code.Code = type("Code", (engine.Target,), {"patch": lambda self, ctx: patch(ctx)})
    sys.modules[code.__name__] = code
    engine.register(engine.Registration(name, option, module, f"{code.__name__}:Code"))

for real in [t.name for t in engine.targets()]:
    engine.unregister(real)  # only this test's targets
"""


def run(code: str, tmp_path, timeout: float = 120) -> dict:
    proc = run_python(PRELUDE + textwrap.dedent(code), cwd=tmp_path, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


class _RefusingMeta(type):
    def __setattr__(cls, name, value):
        if cls.__dict__.get("armed"):
            raise AttributeError(f"{cls.__name__} refuses to set {name}")
        super().__setattr__(name, value)


def test_a_failing_undo_does_not_stop_the_others(caplog):
    guarded = _RefusingMeta("Guarded", (), {"value": "original", "armed": False})
    plain = types.ModuleType("plain")
    plain.value = "original"
    journal = engine.Journal()
    journal.replace("t", plain, "value", "first")
    journal.replace("t", guarded, "value", "patched")
    journal.replace("t", plain, "other", "added")
    type.__setattr__(guarded, "armed", True)
    journal.undo("t")  # no exception: one refused setattr is logged
    assert plain.value == "original" and not hasattr(plain, "other")
    assert journal.records() == []
    assert "could not undo" in caplog.text and "refuses to set value" in caplog.text


def test_unpatch_after_a_refused_undo_leaves_a_consistent_state(tmp_path):
    seen = run(
        """
        plain = types.ModuleType("plain_mod"); plain.value = "original"; sys.modules["plain_mod"] = plain
        class Meta(type):
            def __setattr__(cls, name, value):
                if cls.__dict__.get("armed"):
                    raise AttributeError("refused")
                super().__setattr__(name, value)
        Guarded = Meta("Guarded", (), {"value": "original", "armed": False})
        def patch(ctx):
            ctx.replace(Guarded, "value", "patched")
            ctx.replace(plain, "value", "patched")
        target("faulty", "plain_mod", patch)
        nanopatch.patch_torch()
        type.__setattr__(Guarded, "armed", True)
        nanopatch.unpatch_torch()
        state = nanopatch.status()
        print(json.dumps({"plain": plain.value, "patched": nanopatch.is_patched(),
                          "state": state["targets"]["faulty"]["state"], "records": len(engine.JOURNAL.records())}))
        """,
        tmp_path,
    )
    assert seen == {"plain": "original", "patched": False, "state": "unpatched", "records": 0}


def test_an_interrupt_inside_a_target_leaves_nothing_half_applied(tmp_path):
    """Ctrl-C while a target patches (a notebook): what it replaced is undone, nothing claims to
    be patched, and a later ``patch_torch()`` applies everything (it returned early before, with
    the target's records in the journal and the target never marked applied)."""
    seen = run(
        """
        import os
        mod = types.ModuleType("victim"); mod.a = "original"; mod.b = "original"; sys.modules["victim"] = mod
        interrupt = [True]
        def first(ctx):
            ctx.replace(mod, "a", "patched")
        def second(ctx):
            ctx.replace(mod, "b", "patched")
            if interrupt[0]:
                raise KeyboardInterrupt
        target("first", "victim", first)
        target("second", "victim", second)
        try:
            nanopatch.patch_torch()
            raised = False
        except KeyboardInterrupt:
            raised = True
        after = {"raised": raised, "a": mod.a, "b": mod.b, "patched": nanopatch.is_patched(),
                 "records": len(engine.JOURNAL.records())}
        interrupt[0] = False
        nanopatch.patch_torch()
        again = {"a": mod.a, "b": mod.b, "patched": nanopatch.is_patched()}
        nanopatch.unpatch_torch()
        print(json.dumps({"after": after, "again": again, "undone": [mod.a, mod.b]}))
        """,
        tmp_path,
    )
    assert seen["after"] == {"raised": True, "a": "original", "b": "original", "patched": False, "records": 0}
    assert seen["again"] == {"a": "patched", "b": "patched", "patched": True}
    assert seen["undone"] == ["original", "original"]


def test_patching_while_another_thread_first_imports_the_module_does_not_deadlock(tmp_path):
    """Thread B imports ``racepkg`` (its body waits a moment), whose targets nanopatch applies
    on import; meanwhile the main thread, inside the engine's lock, applies a target that
    imports ``racepkg.sub`` and so waits for B's import. B's post-import hook must not wait for
    the engine's lock in turn: before, each waited for the other for good."""
    package = tmp_path / "racepkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import os, time\n"
        "open(os.environ['RACE_STARTED'], 'w').close()\n"
        "deadline = time.time() + 20\n"
        "while not os.path.exists(os.environ['RACE_GO']) and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "VALUE = 'original'\n"
    )
    (package / "sub.py").write_text("SUB = 'original'\n")
    seen = run(
        f"""
        import os, threading, time
        sys.path.insert(0, {str(tmp_path)!r})
        os.environ["RACE_STARTED"] = {str(tmp_path / "started")!r}
        os.environ["RACE_GO"] = {str(tmp_path / "go")!r}

        def on_import(ctx):
            import racepkg
            ctx.replace(racepkg, "VALUE", "patched")
        target("on-import", "racepkg", on_import)
        nanopatch.patch_torch()  # racepkg not imported yet: its target waits for the import

        importer = threading.Thread(target=lambda: __import__("racepkg"), daemon=True)
        importer.start()
        while not os.path.exists(os.environ["RACE_STARTED"]):
            time.sleep(0.01)
        # release the import once this thread is inside the engine, waiting for racepkg.sub
        threading.Timer(1.0, lambda: open(os.environ["RACE_GO"], "w").close()).start()

        def needs_sub(ctx):
            import racepkg.sub
            ctx.replace(racepkg.sub, "SUB", "patched")
        target("needs-sub", "threading", needs_sub)  # registered while patched: applied at once
        importer.join(30)
        import racepkg, racepkg.sub
        print(json.dumps({{"value": racepkg.VALUE, "sub": racepkg.sub.SUB, "alive": importer.is_alive()}}))
        """,
        tmp_path,
        timeout=90,
    )
    assert seen == {"value": "patched", "sub": "patched", "alive": False}
