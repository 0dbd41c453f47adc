"""Floor 3, the patch targets: one package per concern (``vision``, ``training``, ``parallel``,
``cuda``, ``breakdown``), each with a ``patch.py`` the engine applies when its library is imported.

This module is the list of nanopatch's own targets, registered with the engine in the order they
apply (``import nanopatch`` imports it; it imports none of the targets' code, nor torch). The
engine names no target: adding one is a line here and its package.
"""

from nanopatch import engine

# first: a GPU script's tensors and models are on the CPU before any other target sees them
engine.register(
    engine.Target(name="cuda_to_cpu", option="cuda_to_cpu", module="torch", patcher="nanopatch.targets.cuda.patch")
)
engine.register(
    engine.Target(
        name="cuda_extensions",
        option="cuda_to_cpu",
        module="torch.utils.cpp_extension",
        patcher="nanopatch.targets.cuda.patch",
    )
)
engine.register(
    engine.Target(name="vision", option="vision", module="torchvision", patcher="nanopatch.targets.vision.patch")
)
engine.register(
    engine.Target(name="training", option="training", module="torch", patcher="nanopatch.targets.training.patch")
)
engine.register(
    engine.Target(
        name="distributed", option="data_parallel", module="torch", patcher="nanopatch.targets.parallel.patch"
    )
)
for _name, _module in (("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")):
    engine.register(
        engine.Target(
            name=_name, option="data_parallel", module=_module, patcher="nanopatch.targets.parallel.lightning"
        )
    )
del _name, _module
# last: it times what the others accelerate
engine.register(
    engine.Target(name="breakdown", option="breakdown", module="torch", patcher="nanopatch.targets.breakdown.patch")
)
