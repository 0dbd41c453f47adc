"""train_step's models (ResNet-18/50, a transformer LM, a siamese network, the hidden tiny CNN), their
sizes, and the job of one variant: model, optimizer, data and step.
"""

from __future__ import annotations

from typing import Any

MODELS = ("resnet18", "resnet50", "transformer", "siamese")
HIDDEN_MODELS = ("tiny",)  # a small CNN, for the test suite
CLASSES = 1000
VOCAB = 8192
SIAMESE_BATCH = 64  # the script's default --batch-size
SEED = 20250
#: the sizes: full, and --quick
SHAPES = {
    False: {"image_size": 224, "image_batch": 32, "seq": 256, "text_batch": 8},
    True: {"image_size": 112, "image_batch": 8, "seq": 64, "text_batch": 8},
}


def tiny_model(classes: int = CLASSES):
    """A small CNN (conv-BN-ReLU twice, pooled, linear) for the benches' own end-to-end
    tests; bench/multi_instance.py uses it too."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def siamese_network():
    """The shape of pytorch/examples' ``siamese_network/main.py``: torchvision's ResNet-18 with a
    one-channel first convolution and no classifier, run on each of two 28x28 images, the two
    512-feature vectors concatenated into Linear(1024, 256), ReLU, Linear(256, 1) and a sigmoid
    (trained with ``BCELoss`` and Adadelta there, as here). Small convolutions on small images:
    a model where bf16 does not obviously pay."""
    import torch
    import torchvision
    from torch import nn

    class SiameseNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            resnet = torchvision.models.resnet18(weights=None)
            resnet.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.features = nn.Sequential(*list(resnet.children())[:-1])
            self.head = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(inplace=True), nn.Linear(256, 1))
            self.sigmoid = nn.Sigmoid()

        def forward(self, first, second):
            pair = torch.cat([self.features(first).flatten(1), self.features(second).flatten(1)], 1)
            return self.sigmoid(self.head(pair))

    return SiameseNetwork()


def describe(model: str, shape: dict[str, int]) -> str:
    if model == "siamese":
        return (
            f"pytorch/examples' siamese network (a 1-channel ResNet-18 on each of two 28x28 images, an MLP and a "
            f"sigmoid), batch {SIAMESE_BATCH} pairs, Adadelta, BCELoss"
        )
    if model == "transformer":
        return (
            f"6-layer nn.TransformerEncoder LM (d_model 512, 8 heads, ff 2048, vocabulary {VOCAB}), batch "
            f"{shape['text_batch']} x {shape['seq']} tokens, AdamW, next-token cross-entropy"
        )
    name = "small CNN (2 convolutions)" if model == "tiny" else f"torchvision {model}"
    return (
        f"{name}, batch {shape['image_batch']} at {shape['image_size']} px, SGD(momentum 0.9), "
        f"cross-entropy over {CLASSES} classes"
    )


def unit(model: str) -> str:
    return {"transformer": "tokens/s", "siamese": "pairs/s"}.get(model, "img/s")


class Job:
    """A model, its optimizer and one synthetic batch, and the training step a script runs;
    ``by_hand``: the script edited for bf16 autocast and channels-last (the ``by-hand`` variant).
    ``optimizer=False``: the optimizer is left for :meth:`make_optimizer` to build later (from a
    LightningModule's ``configure_optimizers``)."""

    def __init__(self, model_name: str, shape: dict[str, int], by_hand: bool = False, optimizer: bool = True) -> None:
        import torch
        from torch import nn

        self.by_hand = by_hand
        self.text = model_name == "transformer"
        self.siamese = model_name == "siamese"
        self.optimizer: Any = None
        torch.manual_seed(SEED)
        if self.siamese:
            self.model = siamese_network()
            self.inputs = tuple(torch.rand(SIAMESE_BATCH, 1, 28, 28) * 255 for _ in range(2))  # MNIST's pixel range
            self.targets = torch.randint(0, 2, (SIAMESE_BATCH,)).float()
            self.samples_per_step = SIAMESE_BATCH
            if by_hand:
                self.model = self.model.to(memory_format=torch.channels_last)
        elif self.text:
            batch, seq = shape["text_batch"], shape["seq"]
            self.model = transformer_lm(seq)
            tokens = torch.randint(0, VOCAB, (batch, seq + 1))
            self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            self.samples_per_step = batch * seq
        else:
            batch, size = shape["image_batch"], shape["image_size"]
            if model_name == "tiny":
                self.model = tiny_model()
            else:
                import torchvision

                self.model = getattr(torchvision.models, model_name)(weights=None, num_classes=CLASSES)
            self.inputs = torch.randn(batch, 3, size, size)  # NCHW, as a DataLoader hands every batch
            if by_hand:
                self.model = self.model.to(memory_format=torch.channels_last)
            self.targets = torch.randint(0, CLASSES, (batch,))
            self.samples_per_step = batch
        if optimizer:
            self.make_optimizer(self.model.parameters())
        self.criterion = nn.BCELoss() if self.siamese else nn.CrossEntropyLoss()
        self.model.train()  # as a script's epoch loop does, after building the optimizer

    def make_optimizer(self, parameters):
        """The model's optimizer, over ``parameters``: AdamW for the transformer, SGD otherwise."""
        import torch

        if self.text:
            self.optimizer = torch.optim.AdamW(parameters, lr=1e-4, weight_decay=0.01)
        elif self.siamese:
            self.optimizer = torch.optim.Adadelta(parameters, lr=1.0)
        else:
            self.optimizer = torch.optim.SGD(parameters, lr=0.01, momentum=0.9, weight_decay=1e-4)
        return self.optimizer

    def loss(self, output, targets):
        if self.siamese:
            return self.criterion(output.squeeze(), targets)
        return self.criterion(output.reshape(-1, output.shape[-1]), targets.reshape(-1))

    def forward(self, inputs):
        """The model on a batch: the siamese network takes its two images as two arguments."""
        return self.model(*inputs) if isinstance(inputs, tuple) else self.model(inputs)

    def step(self):
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        inputs = self.inputs
        if self.by_hand and not self.text:  # the edited script converts each batch it is handed
            if self.siamese:
                inputs = tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs)
            else:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.by_hand):
            output = self.forward(inputs)
            loss = self.loss(output, self.targets)
        loss.backward()
        self.optimizer.step()
        return output, loss


def transformer_lm(seq: int):
    import torch
    from torch import nn

    class TransformerLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 512)
            self.position = nn.Embedding(seq, 512)
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(512)
            self.head = nn.Linear(512, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.position(positions)
            x = self.encoder(x, mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    return TransformerLM()
