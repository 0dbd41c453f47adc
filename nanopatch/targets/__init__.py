"""Floor 3, the patch targets: one package per concern (``vision``, ``training``, ``parallel``,
``cuda``, ``breakdown``), each with a ``patch.py`` the engine applies when its library is imported.

This module is the list of nanopatch's own targets, registered with the engine in the order they
apply (``import nanopatch`` imports it; it imports none of the targets' code, nor torch). The
engine names no target: adding one is a line here and its package.
"""

from nanopatch import engine

# first: a GPU script's tensors and models are on the CPU before any other target sees them
engine.register(
    engine.Registration(
        name="cuda_to_cpu", option="cuda_to_cpu", module="torch", target="nanopatch.targets.cuda.patch:CudaToCpu"
    )
)
engine.register(
    engine.Registration(
        name="cuda_extensions",
        option="cuda_to_cpu",
        module="torch.utils.cpp_extension",
        target="nanopatch.targets.cuda.patch:CudaToCpu",
    )
)
engine.register(
    engine.Registration(
        name="vision", option="vision", module="torchvision", target="nanopatch.targets.vision.patch:Vision"
    )
)
engine.register(
    engine.Registration(
        name="training", option="training", module="torch", target="nanopatch.targets.training.patch:Training"
    )
)
# the weights the training target lays out channels-last, saved by safetensors in stock's strides
engine.register(
    engine.Registration(
        name="safetensors",
        option="training",
        module="safetensors.torch",
        target="nanopatch.targets.training.saving:Safetensors",
    )
)
engine.register(
    engine.Registration(
        name="distributed",
        option="data_parallel",
        module="torch",
        target="nanopatch.targets.parallel.patch:DataParallel",
    )
)
for _name, _module in (("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")):
    engine.register(
        engine.Registration(
            name=_name,
            option="data_parallel",
            module=_module,
            target="nanopatch.targets.parallel.lightning:LightningTrainer",
        )
    )
del _name, _module
# last: it times what the others accelerate
engine.register(
    engine.Registration(
        name="breakdown", option="breakdown", module="torch", target="nanopatch.targets.breakdown.patch:Breakdown"
    )
)
