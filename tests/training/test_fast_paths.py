"""Fast dropout masks inside an accelerated training forward, and glibc malloc keeping freed
memory for reuse: what they change, that they are undone, and that training learns as in fp32
with them on (a transformer with dropout, and heads that saturate in bf16)."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.runtime import malloc
from nanopatch.targets.training import dropout
from nanopatch.targets.training import patch as training_patch
from nanopatch.targets.training.plan import Plan, Seen

from conftest import AUTO_COMPUTE, run_python
from helpers.learning_oracle import plans_alive_now, training_details
from helpers.training_tasks import train_and_score


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


# --- the mask generator ----------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fill_bernoulli_has_the_distribution_of_bernoulli(p, dtype):
    n = 1 << 20
    torch.manual_seed(0)
    mask = dropout.fill_bernoulli(torch.empty(n, dtype=dtype), p)
    assert mask.dtype == dtype
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    expected = round(p * 65536) / 65536
    assert abs(expected - p) <= 2**-17
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(mask.float().mean().item() - expected) < 5 * sigma
    # neighbours (lanes of one 64-bit draw) are independent: P(both kept) = p^2
    pairs = (mask[:-1] * mask[1:]).float().mean().item()
    assert abs(pairs - expected**2) < 5 * math.sqrt(expected**2 * (1 - expected**2) / n)


def test_fill_bernoulli_is_reproducible_from_the_seed_and_fills_strided_tensors():
    torch.manual_seed(3)
    a = dropout.fill_bernoulli(torch.empty(64, 128), 0.7)
    torch.manual_seed(3)
    b = dropout.fill_bernoulli(torch.empty(128, 64).t(), 0.7)  # a transposed view
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(3)
    assert torch.equal(dropout.fill_bernoulli(torch.empty(64, 128), 0.7, g), a)


@pytest.fixture(params=[dropout.HASH, dropout.NUMPY])
def hashed(monkeypatch, request):
    """Masks of any size draw their words through the counter hash, or NumPy's PCG64DXSM on
    threads, as where either measured faster than torch's generator."""
    fast = (0.1, 0.2) if request.param == dropout.HASH else (0.2, 0.1)
    monkeypatch.setattr(dropout, "chosen", {torch.get_num_threads(): dropout.Choice(request.param, 1.0, *fast)})
    monkeypatch.setattr(dropout, "HASH_MIN_WORDS", 1)
    monkeypatch.setattr(dropout, "NUMPY_PART_WORDS", 1000)  # several parts even in small masks
    return request.param


def _splitmix64(counter, key):
    z = (counter * 0x9E3779B97F4A7C15 + key) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    z ^= z >> 31
    return z - 2**64 if z >= 2**63 else z


@pytest.mark.parametrize("key", [0, 1, 2**62 + 12345, -(2**63), -987654321])
def test_hash_words_are_splitmix64_of_the_counters(key):
    words = dropout.hash_words(300, key).tolist()
    assert words == [_splitmix64(i, key % 2**64) for i in range(1, 301)]


def test_numpy_words_are_pcg64dxsm_streams_per_part_whatever_the_thread_count(monkeypatch):
    import numpy as np

    monkeypatch.setattr(dropout, "NUMPY_PART_WORDS", 1000)
    key = -(2**63) + 5  # as drawn from torch's generator: a signed value, used as its unsigned bits
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        words = [dropout.numpy_words(3500, key)]  # drawn on the pool's two threads
        torch.set_num_threads(1)
        words.append(dropout.numpy_words(3500, key))  # drawn in this thread
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(words[0], words[1]) and words[0].dtype == torch.int64
    expected = [
        np.random.PCG64DXSM(np.random.SeedSequence([key % 2**64, part])).random_raw(size).view(np.int64)
        for part, size in enumerate([1000, 1000, 1000, 500])
    ]
    assert words[0].tolist() == np.concatenate(expected).tolist()
    assert not torch.equal(dropout.numpy_words(3500, key + 1), words[0])


def test_the_numpy_pool_is_the_processs_own(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        pool = dropout._pool()
        assert pool is dropout._pool() and pool._max_workers == 2
        monkeypatch.setattr(dropout.os, "getpid", lambda: -1)  # as in a forked child
        assert dropout._pool() is not pool
        torch.set_num_threads(1)
        assert dropout._pool() is None
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_hashed_masks_have_the_distribution_of_bernoulli(hashed, p):
    n = 1 << 20
    torch.manual_seed(0)
    mask = dropout.fill_bernoulli(torch.empty(n), p)
    expected = round(p * 65536) / 65536
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(mask.mean().item() - expected) < 5 * sigma
    for lag in (1, 2, 3, 4, 5, 64):  # lanes of one word, of neighbouring words, and further
        both = (mask[:-lag] * mask[lag:]).mean().item()
        assert abs(both - expected**2) < 5 * math.sqrt(expected**2 * (1 - expected**2) / n), lag
    lanes = mask.view(-1, 4).mean(0)  # each of a word's four lanes alike
    assert (lanes - expected).abs().max().item() < 5 * math.sqrt(expected * (1 - expected) / (n // 4))


def test_hashed_masks_are_reproducible_from_the_seed_and_differ_between_draws(hashed):
    torch.manual_seed(3)
    a = dropout.fill_bernoulli(torch.empty(64, 128), 0.7)
    b = dropout.fill_bernoulli(torch.empty(64, 128), 0.7)
    torch.manual_seed(3)
    assert torch.equal(dropout.fill_bernoulli(torch.empty(128, 64).t(), 0.7), a)
    assert not torch.equal(a, b)  # each mask's key is a new draw
    g = torch.Generator().manual_seed(3)
    assert torch.equal(dropout.fill_bernoulli(torch.empty(64, 128), 0.7, g), a)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOPATCH_CACHE_DIR", str(tmp_path))
    return tmp_path / dropout.RECORD_FILE


def test_the_hash_is_chosen_only_where_it_measured_clearly_faster(monkeypatch, cache):
    threads = torch.get_num_threads()
    for generator_s, hash_s, numpy_s, uses in [
        (0.010, 0.001, 0.005, dropout.HASH),
        (0.010, 0.0067, 0.009, dropout.HASH),
        (0.010, 0.008, 0.002, dropout.NUMPY),
        (0.010, 0.009, 0.0066, dropout.NUMPY),
        (0.010, 0.008, 0.0069, dropout.GENERATOR),  # neither clearly faster
    ]:
        timings = iter([generator_s, hash_s, numpy_s])
        monkeypatch.setattr(dropout, "_best", lambda draw, timings=timings: next(timings))
        monkeypatch.setattr(dropout, "chosen", {})
        cache.unlink(missing_ok=True)
        assert dropout.current_method() == uses
        assert dropout.current_method() == uses  # measured once per thread count
        assert list(dropout.chosen) == [threads]
        assert dropout.method()[0].method == uses
    # small masks draw from the generator whatever was chosen
    monkeypatch.setattr(dropout, "chosen", {threads: dropout.Choice(dropout.HASH, 1.0, 0.1, 0.2)})
    torch.manual_seed(5)
    small = dropout.draw_words(dropout.HASH_MIN_WORDS - 1)
    torch.manual_seed(5)
    assert torch.equal(small, torch.empty_like(small).random_(-(2**63), None))


def test_later_runs_on_the_machine_use_the_method_measured_first(monkeypatch, cache):
    timings = iter([0.010, 0.001, 0.005])
    monkeypatch.setattr(dropout, "_best", lambda draw: next(timings))
    monkeypatch.setattr(dropout, "chosen", {})
    threads = torch.get_num_threads()
    assert dropout.current_method() == dropout.HASH
    [(key, record)] = json.loads(cache.read_text()).items()
    assert key.endswith(f"|{threads} threads") and torch.__version__ in key
    assert record == {"method": "hash", "generator_ms": 10.0, "hash_ms": 1.0, "numpy_ms": 5.0}
    # a later process (nothing measured in it yet) reads the record instead of measuring
    monkeypatch.setattr(dropout, "chosen", {})
    monkeypatch.setattr(dropout, "_best", lambda draw: pytest.fail("measured again"))
    assert dropout.current_method() == dropout.HASH
    assert dropout.method() == (dropout.Choice("hash", 10.0, 1.0, 5.0), 262144, threads)
    plan = Plan(name="M", seen=Seen(fast_dropout=True, dropout_method=dropout.method()))
    words = "ms per 262144 words: generator 10.00, hash 1.00, NumPy 5.00"
    assert plan.describe()["dropout_words"] == f"counter hash ({words})"
    assert "fast dropout masks (hashed on all threads)" in plan.summary()
    drawn = (dropout.Choice("numpy", 3.0, 2.0, 1.0), 8, 2)
    numpy = Plan(name="M", seen=Seen(fast_dropout=True, dropout_method=drawn))
    words = "ms per 8 words: generator 3.00, hash 2.00, NumPy 1.00"
    assert numpy.describe()["dropout_words"] == f"NumPy PCG64DXSM on 2 threads ({words})"
    assert "fast dropout masks (drawn on all threads)" in numpy.summary()
    # a record it cannot read, or one of an older nanopatch (no "method"), is measured again
    for unreadable in ("{not json", json.dumps({key: {"hash": True, "generator_ms": 10.0, "hash_ms": 1.0}})):
        cache.write_text(unreadable)
        monkeypatch.setattr(dropout, "chosen", {})
        monkeypatch.setattr(dropout, "_best", lambda draw: 0.005)
        assert dropout.current_method() == dropout.GENERATOR
        assert json.loads(cache.read_text())[key]["method"] == "generator"


def test_measuring_the_hash_leaves_the_runs_random_stream_alone(monkeypatch, cache):
    monkeypatch.setattr(dropout, "chosen", {})
    torch.manual_seed(7)
    dropout.current_method()  # measures, with generators of its own
    after = torch.rand(4)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(4), after)


@pytest.mark.parametrize(
    "tensor, p",
    [
        (torch.empty(100), 0.9),  # small: stock
        (torch.empty(10_000), 0.9999),  # p too close to 1 for 16-bit lanes
        (torch.empty(10_000, dtype=torch.int64), 0.5),
        (torch.empty(10_000), torch.tensor(0.5)),
    ],
)
def test_masks_it_cannot_draw_exactly_enough_run_stock(tensor, p):
    assert not dropout.eligible(tensor, p, None)


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(self.linear(x))


def _one_step(model, x):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    optimizer.zero_grad()
    model(x).sum().backward()  # the forward that finds the model
    optimizer.step()
    torch.manual_seed(11)
    return model(x)


def test_dropout_in_an_accelerated_training_forward_uses_the_fast_masks(monkeypatch):
    calls = []
    real = dropout.fill_bernoulli
    monkeypatch.setattr(dropout, "fill_bernoulli", lambda t, p, g=None: calls.append(t.numel()) or real(t, p, g))
    x = torch.randn(128, 64)  # masks of fewer than dropout.MIN_ELEMENTS run stock
    torch.manual_seed(0)
    earlier = plans_alive_now()
    with nanopatch.patched(bf16=False, ipex=False):
        model = Seq()
        out = _one_step(model, x)
        [plan] = [p for p in training_details() if p not in earlier]
        assert plan["training_calls"] >= 2 and plan["fast_dropout"] is True
        assert "fast dropout masks" in training_patch.summary()[0]
    assert calls, "the accelerated forward drew no fast mask"
    # the mask is the generator's: the same seed gives the same mask outside any model
    torch.manual_seed(11)
    mask = real(torch.empty(128, 64), 0.75)
    with torch.no_grad():
        expected = model.linear(x) * mask / 0.75
    torch.testing.assert_close(out.detach(), expected)
    # in eval mode, and outside the model, nothing is drawn
    calls.clear()
    with nanopatch.patched(bf16=False, ipex=False):
        model.eval()
        model(x)
        F.dropout(torch.randn(64, 64), 0.5, training=True)
    assert calls == []


def test_the_summary_says_when_masks_were_hashed(hashed):
    x = torch.randn(128, 64)
    earlier = plans_alive_now()
    with nanopatch.patched(bf16=False, ipex=False):
        _one_step(Seq(), x)
        [plan] = [p for p in training_details() if p not in earlier]
        assert plan["fast_dropout"] is True
        if hashed == dropout.HASH:
            assert plan["dropout_words"].startswith("counter hash (ms per 262144 words: generator 1.00, hash 0.10")
            assert "fast dropout masks (hashed on all threads)" in training_patch.summary()[0]
        else:
            assert plan["dropout_words"].startswith(f"NumPy PCG64DXSM on {torch.get_num_threads()} thread")
            assert "fast dropout masks (drawn on all threads)" in training_patch.summary()[0]


def test_fast_dropout_off_gives_stocks_masks():
    x = torch.randn(128, 64)
    torch.manual_seed(0)
    with nanopatch.unpatched():
        stock = _one_step(Seq(), x)
    torch.manual_seed(0)
    with nanopatch.patched(bf16=False, ipex=False, channels_last=False, fast_dropout=False):
        patched = _one_step(Seq(), x)
    torch.testing.assert_close(patched, stock)


def test_attention_dropout_inside_torchs_own_operators_is_drawn_fast(monkeypatch):
    """``nn.MultiheadAttention`` calls ``scaled_dot_product_attention`` from C++ with its
    attention dropout: nanopatch's attention kernel takes the call and draws the mask of the
    attention weights (batch x heads, queries, keys) fast."""
    calls = []
    real = dropout.keep_mask
    monkeypatch.setattr(dropout, "keep_mask", lambda s, p, g=None: calls.append(tuple(s)) or real(s, p, g))
    with nanopatch.patched(bf16=True, ipex=False):
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.2, batch_first=True)
        optimizer = torch.optim.AdamW(layer.parameters())
        layer.train()
        x = torch.randn(4, 32, 32)
        for _ in range(2):
            optimizer.zero_grad()
            layer(x).float().pow(2).mean().backward()
            optimizer.step()
    assert (16, 32, 32) in calls, calls  # the attention weights' mask


# --- learning with the fast paths on -------------------------------------------------------


def marker_task(seed=0, n_train=1536, n_test=512, seq=12, vocab=20):
    """Sequences of random tokens with one of four marker tokens (0-3) placed at a random
    position; the class is the marker. A small transformer with dropout learns it to ~90%
    in a few epochs, not trivially."""
    g = torch.Generator().manual_seed(seed)

    def sample(n):
        tokens = torch.randint(4, vocab, (n, seq), generator=g)
        labels = torch.randint(0, 4, (n,), generator=g)
        where = torch.randint(0, seq, (n,), generator=g)
        tokens[torch.arange(n), where] = labels
        noise = torch.rand(n, generator=g) < 0.1  # 10% of the labels are wrong: the ceiling is ~92%
        labels = torch.where(noise, torch.randint(0, 4, (n,), generator=g), labels)
        return tokens, labels

    return sample(n_train), sample(n_test)


class TinyClassifier(nn.Module):
    def __init__(self, vocab=20, seq=12, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(seq, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 4)

    def forward(self, tokens):
        x = self.encoder(self.embed(tokens) + self.position)
        return self.head(x.mean(1))


def train_transformer(data, epochs=6):
    return train_and_score(data, epochs, TinyClassifier, lambda params: torch.optim.AdamW(params, lr=3e-3))


@pytest.mark.parametrize("words", [dropout.GENERATOR, dropout.HASH, dropout.NUMPY])
def test_a_transformer_with_dropout_learns_as_in_fp32_with_the_fast_paths_on(monkeypatch, words):
    if words != dropout.GENERATOR:
        monkeypatch.setattr(dropout, "chosen", {torch.get_num_threads(): dropout.Choice(words, 1.0, 0.1, 0.1)})
        monkeypatch.setattr(dropout, "HASH_MIN_WORDS", 1)
    calls = []
    real = dropout.fill_bernoulli
    monkeypatch.setattr(dropout, "fill_bernoulli", lambda t, p, g=None: calls.append(1) or real(t, p, g))
    """In the precision nanopatch gives the model on this CPU: bf16 where it is native; fp32 on a
    CPU without (144 steps of emulated bf16 products took four minutes there, per torch env)."""
    data = marker_task()
    with nanopatch.unpatched():
        stock = train_transformer(data)
    with nanopatch.patched(bf16=AUTO_COMPUTE == "bfloat16", ipex=False):
        patched = train_transformer(data)
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["computed_in"] == AUTO_COMPUTE
    assert calls, "no fast dropout mask was drawn"
    assert stock > 70, f"the task is too hard to compare on ({stock:.1f}%)"
    assert abs(patched - stock) <= 1.0 or patched > stock, f"patched {patched:.2f}% vs fp32 {stock:.2f}%"


def confident_task(seed=0, n=512):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    return x, y


@pytest.mark.parametrize("head", ["sigmoid-bce", "softmax-nll"])
def test_heads_that_saturate_in_bf16_learn_as_in_fp32(head):
    """Logits grow past 8 on a separable task: a bf16 sigmoid is then exactly 1.0 and BCE sees
    log(0); a bf16 softmax's log is -inf. nanopatch computes these output activations in fp32."""
    x, y = confident_task()

    def train():
        torch.manual_seed(0)
        if head == "sigmoid-bce":
            model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Sigmoid())
            loss_of = lambda out: F.binary_cross_entropy(out.squeeze(1), y.float())  # noqa: E731
        else:
            model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2), nn.Softmax(dim=1))
            loss_of = lambda out: F.nll_loss(torch.log(out), y)  # noqa: E731
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model.train()
        for _ in range(150):
            optimizer.zero_grad()
            loss = loss_of(model(x))
            loss.backward()
            optimizer.step()
        return loss.item()

    with nanopatch.unpatched():
        stock = train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NanopatchWarning)
        with nanopatch.patched(bf16=True, ipex=False):
            patched = train()
            [plan] = nanopatch.status()["targets"]["training"]["details"]
            assert plan["computed_in"] == "bfloat16" and plan["fp32_heads"] == 1
    assert stock < 0.05, f"the task did not saturate ({stock:.3f})"
    assert math.isfinite(patched) and patched < 0.05 + 2 * stock, f"patched {patched:.4f} vs fp32 {stock:.4f}"


# --- glibc malloc ------------------------------------------------------------------------------


def test_malloc_is_left_alone_when_the_user_or_another_allocator_chose(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 00:00 0  /usr/lib/libtcmalloc_minimal.so.4\n")
    assert "libtcmalloc_minimal.so.4" in malloc.why_not({}, str(maps))
    maps.write_text("7f00-7f01 r-xp 00000000 00:00 0  /usr/lib/libc.so.6\n")
    if malloc.why_not({}, str(maps)) == "the C library is not glibc":
        pytest.skip("not glibc")
    assert malloc.why_not({}, str(maps)) is None
    assert "MALLOC_MMAP_MAX_" in malloc.why_not({"MALLOC_MMAP_MAX_": "0"}, str(maps))
    assert "GLIBC_TUNABLES" in malloc.why_not({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, str(maps))


_FAULTS = """
import json, resource, sys, torch
import nanopatch
from nanopatch.runtime import malloc

def faults_of_reuse():
    for _ in range(12):  # warm: the heap grows to its working size in the first rounds (how many
        # depends on where small allocations land between the big ones)
        torch.ones(16 * 2**20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        torch.ones(16 * 2**20)  # 64 MiB, allocated, filled and freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

report = {"why_not": malloc.why_not(), "stock": faults_of_reuse()}
nanopatch.patch_torch(ipex=False, vision=False)
changes = nanopatch.status()["targets"]["training"]["changes"]
report["entry"] = [c for c in changes if "malloc" in c]
from nanopatch.targets.training import patch as training
report["told"] = training.malloc_reuse()
report["patched"] = faults_of_reuse()
nanopatch.unpatch_torch()
report["after"] = [c for c in nanopatch.status()["targets"]["training"]["changes"] if "malloc" in c]
report["told_after"] = training.malloc_reuse()
print(json.dumps(report))
"""


def test_patched_process_reuses_freed_memory_instead_of_faulting_it_in_again():
    env_proc = run_python(_FAULTS, check=True)
    report = json.loads(env_proc.stdout.strip().splitlines()[-1])
    if report["why_not"] is not None:
        pytest.skip(f"malloc is not tuned in this process: {report['why_not']}")
    pages = 64 * 2**20 // 4096
    assert report["stock"] > 3 * pages  # glibc maps each 64 MiB block afresh: every page faults
    assert report["patched"] < pages // 4, report
    assert report["entry"] and report["after"] == []
    # what --compare's closing lines read: said while patched, gone after
    assert report["told"].startswith("glibc malloc keeps freed memory") and report["told_after"] is None
