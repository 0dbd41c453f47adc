"""Every model family and framework the suite trains learns as stock under ``patch_torch()``'s
defaults, on the torch this env runs (every tox env runs this file): the learning oracle
(tests/helpers/learning_oracle.py) compares stock and patched runs from one seed, step by step.

Also: activation checkpointing (torch's reentrant and non-reentrant, Hugging Face's) leaves a
patched run's gradients as they are without it."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch.engine import config
from nanopatch.foundation import cpu
from nanopatch.learning import Tolerance

from conftest import AUTO_COMPUTE
from helpers.learning_oracle import framework, gradients_after, learns_as_stock, relative_difference, seed_everything
from helpers.training_tasks import STEPS, LeNet, ResidualMLP, TransformerLM, lm_batches, lm_loss, loop


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


# --- the model zoo --------------------------------------------------------------------------


def test_a_transformer_lm_with_dropout_learns_as_stock():
    def train():
        model = TransformerLM()
        loop(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_batches(), lm_loss)

    outcome = learns_as_stock(train, min_steps=STEPS)
    assert len(outcome.stock[-1].grads) == sum(1 for _ in TransformerLM().parameters())


class LstmLM(nn.Module):
    def __init__(self, vocab: int = 512, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.drop = nn.Dropout(0.2)
        self.rnn = nn.LSTM(width, width, num_layers=2, dropout=0.2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.drop(self.embed(tokens)))
        return self.head(self.drop(out))


def test_an_lstm_lm_with_dropout_learns_as_stock():
    def train():
        model = LstmLM()
        loop(model, torch.optim.SGD(model.parameters(), lr=0.5), lm_batches(), lm_loss)

    learns_as_stock(train, min_steps=STEPS)


def image_batches(n: int = 6, batch: int = 32, size: int = 32, classes: int = 10, noise: float = 1.5) -> list[tuple]:
    """Images of ten classes, each a fixed random template plus noise: a task a ResNet learns
    step by step (not random images it can only memorise)."""
    g = torch.Generator().manual_seed(2)
    templates = torch.randn(classes, 3, size, size, generator=g)
    batches = []
    for _ in range(n):
        labels = torch.randint(0, classes, (batch,), generator=g)
        batches.append((templates[labels] + noise * torch.randn(batch, 3, size, size, generator=g), labels))
    return batches


def test_a_resnet_with_sgd_and_momentum_learns_as_stock():
    torchvision = pytest.importorskip("torchvision")

    def train():
        model = torchvision.models.resnet18(num_classes=10)
        # lr 0.001 and batches of 64: nanopatch's final loss stays within 3% of stock's over seeds 0-3
        # here. At lr 0.01 on batches of 16 the loss leaps between steps and bf16 autocast written by
        # hand ends 32% from fp32, as nanopatch does (learning.Tolerance widens to such noise).
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
        loop(model, optimizer, image_batches(batch=64), lambda m, b: F.cross_entropy(m(b[0]), b[1]))

    outcome = learns_as_stock(train, min_steps=STEPS)
    assert any(m["channels_last"] for m in outcome.models)


def test_convolutions_with_biases_before_batch_norms_learn_as_stock():
    """The tutorials' pattern: ``nn.Conv2d`` keeps its default bias, a batch norm follows. The
    norm takes the mean away, so the bias's gradient is zero but for rounding: stock moves it by
    less than fp32's rounding, bf16 (by hand as by nanopatch) by more. The oracle said such a run
    "does not learn as stock" (a parameter stock never updates was updated patched)."""
    shape = (3, 32, 32)
    g = torch.Generator().manual_seed(7)
    templates = torch.randn(5, *shape, generator=g)
    batches = []
    for _ in range(4):
        labels = torch.randint(0, 5, (16,), generator=g)
        batches.append((templates[labels] + torch.randn(16, *shape, generator=g), labels))

    def train():
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 5),
        )  # fmt: skip
        loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
            batches,
            lambda m, b: F.cross_entropy(m(b[0]), b[1]),
        )

    outcome = learns_as_stock(train, min_steps=STEPS)
    stock_moved = set().union(*(s.updated for s in outcome.stock))
    assert {"0.bias", "3.bias"} - stock_moved  # the case itself: stock leaves a bias where it was


def test_a_lenet_that_flattens_with_view_learns_as_stock():
    """``x.view(-1, 16 * 5 * 5)`` after the convolutions raised under channels-last at the first
    call; now the first calls copy where the view cannot and the model goes on in stock's layout
    (tests/training/test_training.py has the mechanics)."""
    batches = image_batches(n=4, batch=16, classes=4)

    def train():
        model = LeNet()
        loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            batches,
            lambda m, b: F.cross_entropy(m(b[0]), b[1]),
        )

    # the native path: IPEX lays a model's weights out itself, which the rescue does not take back
    # (under IPEX such a view still raises; see docs/what-is-patched.md)
    outcome = learns_as_stock(train, {"channels_last": True, "ipex": False}, min_steps=STEPS)
    assert any("channels-last off: its forward views" in note for m in outcome.models for note in m.get("notes", []))


class ScaledMatmul(torch.autograd.Function):
    """A custom Function without ``torch.amp.custom_bwd`` whose backward mixes its gradient (bf16
    under autocast) with its fp32 weight: it raised in ``loss.backward()`` under bf16."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return (x @ w) * 0.5

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        return (grad @ w.T) * 0.5, (x.T @ grad) * 0.5


class FunctionMLP(nn.Module):
    def __init__(self, width: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.inner = nn.Linear(16, width)
        self.w = nn.Parameter(torch.randn(width, width) * 0.2)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(ScaledMatmul.apply(torch.relu(self.inner(x)), self.w)))


def test_a_custom_function_whose_backward_mixes_dtypes_learns_as_stock():
    """In bf16 (asked for: it is what meets the Function's backward) the failing backward ops run
    in fp32 and every parameter, the Function's weight included, learns as stock's
    (tests/training/test_training.py has the mechanics)."""
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(4)]

    def train():
        model = FunctionMLP()
        loop(
            model, torch.optim.AdamW(model.parameters(), lr=1e-3), batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])
        )

    outcome = learns_as_stock(train, {"bf16": True, "ipex": False}, min_steps=STEPS)
    assert "w" in outcome.patched[-1].grads
    assert any("custom autograd Function ScaledMatmul" in note for m in outcome.models for note in m.get("notes", []))


class Generator(nn.Module):
    def __init__(self, z: int = 16, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(z, width * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(width * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(width * 2, width, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(True),
            nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(-1)


def train_gan(iterations: int = STEPS // 2) -> None:
    netG, netD = Generator(), Discriminator()
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(3)
    real = torch.rand(16, 3, 16, 16, generator=g) * 2 - 1
    noise = torch.randn(iterations, 16, 16, 1, 1, generator=g)
    ones, zeros = torch.ones(16), torch.zeros(16)
    for i in range(iterations):
        netD.zero_grad()
        fake = netG(noise[i])
        errD = F.binary_cross_entropy(netD(real), ones) + F.binary_cross_entropy(netD(fake.detach()), zeros)
        errD.backward()
        optD.step()
        netG.zero_grad()
        errG = F.binary_cross_entropy(netD(fake), ones)
        errG.backward()
        optG.step()


def test_a_gan_with_two_optimizers_learns_as_stock():
    outcome = learns_as_stock(train_gan, min_steps=STEPS)
    assert [s.optimizer for s in outcome.stock[:2]] == ["Adam", "Adam#2"]
    assert len([m for m in outcome.models if m.get("computed_in") == AUTO_COMPUTE]) == 2, outcome.models


def tiny_bert(transformers):
    cfg = transformers.BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(cfg)


def tiny_gpt2(transformers):
    cfg = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


def hf_batches(n: int = 3):
    g = torch.Generator().manual_seed(4)
    return [(torch.randint(0, 512, (8, 32), generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_hugging_face_models_built_from_configs_learn_as_stock(family):
    transformers = framework("transformers")

    def train():
        model = tiny_bert(transformers) if family == "bert" else tiny_gpt2(transformers)

        def loss_of(m, batch):
            ids, labels = batch
            return m(input_ids=ids, labels=labels if family == "bert" else ids).loss

        loop(model, torch.optim.AdamW(model.parameters(), lr=1e-3), hf_batches(), loss_of)

    learns_as_stock(train, min_steps=STEPS)


def test_ipex_fused_step_learns_as_stock():
    """Where IPEX is usable (the ipex env), ``patch_torch()``'s defaults give an SGD model
    IPEX's optimize and fused step; the model learns as stock."""
    ok, why = config.ipex_compatibility()
    if not ok:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") == "1":
            pytest.fail(f"the ipex env must test IPEX, but {why}")
        pytest.skip(f"IPEX: {why}")

    def train():
        model = nn.Sequential(
            nn.Linear(32, 128), nn.LayerNorm(128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(),
            nn.Linear(128, 10),
        )  # fmt: skip
        g = torch.Generator().manual_seed(5)
        batches = [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(3)]
        loop(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batches,
             lambda m, b: F.cross_entropy(m(b[0]), b[1]))  # fmt: skip

    outcome = learns_as_stock(train, min_steps=STEPS)
    assert any(m["ipex"] for m in outcome.models), outcome.models


# --- activation checkpointing ---------------------------------------------------------------


def trained_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients of what the optimizer trains (IPEX adds empty parameters of its own to the
    model, which get none)."""
    return [p.grad.clone() for group in optimizer.param_groups for p in group["params"]]


def residual_mlp_gradients(checkpointing: str | None, steps: int = 3) -> list[torch.Tensor]:
    seed_everything(0)
    model = ResidualMLP(checkpointing)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(64, 128, generator=g), torch.randint(0, 10, (64,), generator=g)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads = trained_gradients(optimizer)
        optimizer.step()
    return grads


@pytest.mark.parametrize("checkpointing", ["non-reentrant", "reentrant"])
def test_torch_checkpointing_leaves_a_patched_runs_gradients_as_they_are(checkpointing):
    with nanopatch.patched():
        plain = gradients_after(lambda: residual_mlp_gradients(None))
        checkpointed = gradients_after(lambda: residual_mlp_gradients(checkpointing))
        [plan] = [p for p in nanopatch.status()["targets"]["training"]["details"] if p["model"] == "ResidualMLP"][-1:]
    assert plan["fast_dropout"], "the fast masks did not run: the identity below would prove nothing"
    difference = relative_difference(checkpointed, plain)
    if plan["ipex"] and checkpointing == "reentrant":
        # A reentrant checkpoint runs its forward under no_grad, where IPEX's own kernels round
        # differently: nanopatch's replay is held to what IPEX by hand gives.
        by_hand = by_hand_ipex_reentrant_difference(torch.bfloat16 if plan["computed_in"] == "bfloat16" else None)
        bound = 1.5 * by_hand + 1e-6
        if cpu.host_facts().vendor != "GenuineIntel":
            # IPEX is built for Intel's CPUs. On a 2-core AMD EPYC Zen 4 at one thread (the suite's
            # xdist workers), IPEX by hand replays exactly while nanopatch's replay differs at bf16's
            # rounding (1.5e-3; the same before this bound existed, cause not found): held to
            # bf16's rounding there, not to IPEX's exactness.
            bound = max(bound, 2**-8)
        assert difference <= bound, difference
    else:
        assert difference == 0.0


def by_hand_ipex_reentrant_difference(dtype: torch.dtype | None) -> float:
    """The relative gradient difference reentrant checkpointing makes under IPEX written by hand
    (``ipex.optimize``, and ``torch.autocast`` for bf16; no nanopatch), in ``dtype`` (None:
    fp32, where nanopatch chose fp32 or IPEX has no bf16 on this CPU)."""
    import intel_extension_for_pytorch as ipex

    def gradients(checkpointing: str | None) -> torch.Tensor:
        seed_everything(0)
        model = ResidualMLP(checkpointing)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype or torch.float32)
        g = torch.Generator().manual_seed(6)
        x, y = torch.randn(64, 128, generator=g), torch.randint(0, 10, (64,), generator=g)
        for _ in range(3):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
                out = model(x)
            F.cross_entropy(out.float(), y).backward()
            grads = trained_gradients(optimizer)
            optimizer.step()
        return torch.cat([t.float().flatten() for t in grads])

    with nanopatch.unpatched():
        return relative_difference(gradients("reentrant"), gradients(None))


@pytest.mark.parametrize("reentrant", [False, True])
def test_hugging_face_gradient_checkpointing_leaves_a_patched_runs_gradients_as_they_are(reentrant):
    """Non-reentrant: identical. Reentrant checkpointing runs the forward under no_grad, where
    torch's own bf16 autocast already takes kernels whose rounding differs (stock torch with
    the user's own ``torch.autocast`` gives BERT's gradients 0.1% apart): within 1%."""
    transformers = framework("transformers")

    def gradients(checkpointing: bool) -> list[torch.Tensor]:
        seed_everything(0)
        model = tiny_bert(transformers)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model.train()
        for ids, labels in hf_batches():
            optimizer.zero_grad()
            model(input_ids=ids, labels=labels).loss.backward()
            grads = trained_gradients(optimizer)
            optimizer.step()
        return grads

    with nanopatch.patched():
        plain = gradients_after(lambda: gradients(False))
        checkpointed = gradients_after(lambda: gradients(True))
    difference = relative_difference(checkpointed, plain)
    assert difference <= (0.01 if reentrant else 0.0), difference


# --- frameworks -------------------------------------------------------------------------------


def token_dataset(n: int = 96, vocab: int = 512, length: int = 32):
    g = torch.Generator().manual_seed(8)
    return torch.randint(0, vocab, (n, length + 1), generator=g)


def lightning_module(L, manual: bool):
    class LitLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = TransformerLM()
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            (tokens,) = batch
            loss = lm_loss(self.model, tokens)
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return LitLM()


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_lightning_module_learns_as_stock(manual):
    """Automatic optimization runs the forward inside optimizer.step(closure); manual
    optimization calls manual_backward and step itself."""
    L = framework("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    def train():
        module = lightning_module(L, manual)
        trainer = L.Trainer(
            max_steps=STEPS,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, DataLoader(TensorDataset(token_dataset()), batch_size=8, shuffle=False))

    learns_as_stock(train, min_steps=STEPS)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_a_hugging_face_trainer_run_learns_as_stock(tmp_path, checkpointing):
    transformers = framework("transformers")

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.data = hf_batches(n=12)

        def __len__(self) -> int:
            return 8 * len(self.data)

        def __getitem__(self, i: int) -> dict:
            ids, labels = self.data[i // 8]
            return {"input_ids": ids[i % 8], "labels": labels[i % 8]}

    def train():
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=STEPS,
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            use_cpu=True,
            dataloader_num_workers=0,
            seed=0,
            gradient_checkpointing=checkpointing,
            disable_tqdm=True,
        )
        transformers.Trainer(model=tiny_bert(transformers), args=args, train_dataset=Tokens()).train()

    learns_as_stock(train, min_steps=STEPS)


def test_a_timm_loop_with_its_optimizer_factory_and_ema_learns_as_stock():
    framework("timm")
    import timm
    import timm.optim
    from timm.utils import ModelEmaV3

    def train():
        model = timm.create_model(
            "vit_tiny_patch16_224",
            pretrained=False,
            img_size=32,
            patch_size=8,
            depth=2,
            num_classes=10,
            drop_rate=0.0,  # timm's default head; attention dropout and drop-path as fine-tuning uses them
            attn_drop_rate=0.1,
            drop_path_rate=0.1,
        )
        optimizer = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
        ema = ModelEmaV3(model, decay=0.9)
        model.train()
        for step in range(STEPS):
            images, labels = image_batches(batch=64)[step % 6]
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            ema.update(model)

    learns_as_stock(train, min_steps=STEPS)


@pytest.mark.parametrize("case", ["transformer", "conv", "conv-own-ddp", "sparse"])
def test_nproc_2_learns_as_one_process_with_the_doubled_batch(tmp_path, case):
    """``--nproc 2`` (auto_lr off: the same learning rate) against the same script run alone
    with the doubled batch: DDP averages the two halves' gradients, so the steps match; the
    loss is the mean of the two ranks' halves. The convolutional net's channels-last is
    measured first (where nanopatch chose it), its gradients averaged by nanopatch until then,
    and DDP wraps it once decided. In the script's own DDP (``conv-own-ddp``: its process
    group, sampler and wrapper, as a torchrun script) the layout is measured inside the
    wrapper, whose gradient buckets are laid out again at each switch (torch misplaces the
    averaged gradients' elements where their strides differ from the buckets'). A recommender
    with a sparse embedding bag (``sparse``): accelerated (it ran stock), in DDP."""
    import json

    from nanopatch.foundation import cpu
    from nanopatch.learning import Step, compare

    from conftest import TESTS_DIR, child_env, run_python

    if len(cpu.host_facts().allowed_cpus) < 2:
        pytest.skip("needs two CPUs")
    conv, own = case.startswith("conv"), case == "conv-own-ddp"
    script = str(TESTS_DIR / "data" / "learn_nproc.py")
    stock_out, dp_out = tmp_path / "stock", tmp_path / "dp"
    stock_out.mkdir(), dp_out.mkdir()
    extra = ["--conv", "--epochs", "10"] if conv else ["--sparse", "--epochs", "10"] if case == "sparse" else []
    run_python([script, "--out", str(stock_out), "--batch", "32", *extra], env=child_env(), check=True, timeout=300)
    run_python(
        ["-m", "nanopatch", "--nproc", "2", "--no-auto-lr", script, "--out", str(dp_out), "--batch", "16", *extra]
        + (["--own-ddp"] if own else []),
        env=child_env(),
        check=True,
        timeout=300,
    )

    def steps(path):
        return [Step.from_dict(s) for s in json.loads(path.read_text())["steps"]]

    stock = steps(stock_out / "rank0.json")
    ranks = [steps(dp_out / f"rank{r}.json") for r in (0, 1)]
    assert json.loads((dp_out / "rank1.json").read_text())["world"] == "2"
    assert len(stock) == len(ranks[0]) == len(ranks[1]) == (12 if case == "transformer" else 40)
    weights = [json.loads((dp_out / f"rank{r}.json").read_text())["weights"] for r in (0, 1)]
    assert weights[0] == weights[1]  # every rank ends with the same weights
    notes = json.loads((dp_out / "rank0.json").read_text())["notes"]
    ours = "data-parallel: DistributedDataParallel over 2 processes"
    assert (ours in notes) is not own
    measured = [i for i, note in enumerate(notes) if note.startswith(("channels-last kept: ", "channels-last off: "))]
    if conv and any("channels-last" in note for note in notes):  # nanopatch chose it: measured first
        assert measured
        assert own or notes.index(ours) > max(measured)
    for rank in ranks:
        verdict = compare(stock, rank, Tolerance(final=1.0, step=1.0))  # the gradients and updates, step by step
        assert verdict.learns, verdict.summary()
    mean = [
        Step(a.optimizer, (a.loss + b.loss) / 2, a.grads, a.updated, a.zero, a.nonfinite)
        for a, b in zip(ranks[0], ranks[1], strict=True)
    ]
    verdict = compare(stock, mean)
    assert verdict.learns, verdict.summary()


def test_nproc_2_averages_sparse_gradients_no_ddp_covers(tmp_path):
    """Under ``--nproc`` the gradients no DDP wrapper covers (here: ``--no-training``, so no
    model is wrapped; a shuffling loader, sharded) are averaged by nanopatch before each step; sparse ones (an
    ``EmbeddingBag(sparse=True)``'s) were left out, and the ranks' embeddings drifted apart."""
    import json

    from nanopatch.foundation import cpu

    from conftest import TESTS_DIR, child_env, run_python

    if len(cpu.host_facts().allowed_cpus) < 2:
        pytest.skip("needs two CPUs")
    script = str(TESTS_DIR / "data" / "learn_nproc.py")
    command = ["-m", "nanopatch", "--nproc", "2", "--no-training", script, "--out", str(tmp_path), "--sparse"]
    run_python([*command, "--shuffle", "--epochs", "2"], env=child_env(), check=True, timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[1]["world"] == "2" and ranks[0]["notes"] == []  # nothing accelerated, no DDP
    assert ranks[0]["weights"] == ranks[1]["weights"]


# --- the oracle catches what it is for ----------------------------------------------------------


def test_the_oracle_catches_a_cut_gradient_path():
    """A patched run in which the layers before one module lose their gradients (a fast path
    that detaches a module's output): the oracle names them."""

    def train():
        model = TransformerLM()
        if nanopatch.is_patched():
            model.embed.register_forward_hook(lambda module, args, out: out.detach())
        loop(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_batches(), lm_loss)

    with pytest.raises(AssertionError, match=r"at step 1, 1 of \d+ parameters .* got none patched \(embed\.weight\)"):
        learns_as_stock(train)


def test_under_a_dispatch_mode_ipexs_layer_norm_cuts_the_gradients():
    """Why fast dropout masks are a kernel for one operator and not a dispatch mode: IPEX
    gives aten::layer_norm a CPU kernel whose autograd comes from the operators it calls, and
    under any TorchDispatchMode those record nothing. A mode that only passes every call on
    cuts the gradients of every layer before a layer norm."""
    ok, why = config.ipex_compatibility()
    if not ok:
        if os.environ.get("NANOPATCH_TEST_REQUIRE_IPEX") == "1":
            pytest.fail(f"the ipex env must test IPEX, but {why}")
        pytest.skip(f"IPEX: {why}")
    import intel_extension_for_pytorch  # noqa: F401 - registers IPEX's operators
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def train():
        model = TransformerLM()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(4):
            optimizer.zero_grad()
            with PassThrough() if nanopatch.is_patched() else contextlib.nullcontext():
                loss = lm_loss(model, lm_batches()[step % 3])
            loss.backward()
            optimizer.step()

    with pytest.raises(AssertionError, match="got none patched"):
        learns_as_stock(train, {"fast_dropout": False})
