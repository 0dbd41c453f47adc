"""Data-parallel processes on one machine talk over loopback, and nothing else listens.

torch's rendezvous store (a ``TCPStore`` master) listens on every interface whatever host it is
given, without authentication, and gloo's connections listen on the address the host name
resolves to: a job of one machine would take connections from the network. Here the store's
listening socket is made by nanopatch, bound to 127.0.0.1, and handed to the store
(``master_listen_fd``), and gloo is told to use the loopback interface (``GLOO_SOCKET_IFNAME``,
unless you set it). The same socket is the port: no free port is looked up first and bound
later, which another process could take in between.

``--nproc`` on one node gets it through a rendezvous backend of its own, ``nanopatch-local``,
registered with torch's documented registry (``rendezvous_handler_registry``) in the launcher
process: the launcher hosts the store, the ranks connect to it as torchrun's ranks do to its
agent's store (``TORCHELASTIC_USE_AGENT_STORE``). BigDL-Nano's ``TorchNano`` hosts it the same
way in the calling process. Several nodes use torchrun's own rendezvous, which has to listen on
the network.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import socket
from typing import Any

logger = logging.getLogger("nanopatch")

#: the address everything of a one-machine job listens on and connects to
LOOPBACK = "127.0.0.1"
#: the rendezvous backend ``--nproc`` on one node uses (registered by :func:`register_rendezvous`)
BACKEND = "nanopatch-local"
#: tells a rank's ``init_process_group`` to connect to the store its launcher hosts
AGENT_STORE_VARIABLE = "TORCHELASTIC_USE_AGENT_STORE"


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux), or None if there is none."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return "lo" if "lo" in names else next((name for name in names if name.startswith("lo")), None)


def gloo_on_loopback(environ: dict[str, str] | None = None) -> None:
    """Have gloo's connections of this process and the ones it starts use the loopback
    interface, unless ``GLOO_SOCKET_IFNAME`` is set already."""
    environ = os.environ if environ is None else environ
    name = loopback_interface()
    if name is not None:
        environ.setdefault("GLOO_SOCKET_IFNAME", name)


def host_store(world_size: int | None = None, timeout_s: float = 600) -> Any:
    """A ``TCPStore`` master that listens on 127.0.0.1 only, on a port the kernel chose (its
    ``.port``). Where this torch's store cannot take a listening socket (on its libuv backend,
    then on its older one), a master on 127.0.0.1 that listens wherever torch puts it, with one
    logged line saying so."""
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((LOOPBACK, 0))
        listener.listen(128)
        port = listener.getsockname()[1]
    except OSError:
        listener.close()
        raise
    fd = listener.detach()  # the store's, once it takes it
    reason: Exception | None = None
    for options in ({}, {"use_libuv": False}):
        try:
            return TCPStore(
                LOOPBACK, port, world_size, True, timeout, wait_for_workers=False, master_listen_fd=fd, **options
            )
        except (TypeError, NotImplementedError, RuntimeError, ValueError) as exc:
            reason = exc
    with contextlib.suppress(OSError):
        os.close(fd)
    logger.warning(
        "nanopatch: this torch's TCPStore takes no listening socket (%s): its store listens where torch puts it",
        reason,
    )
    return TCPStore(LOOPBACK, 0, world_size, True, timeout, wait_for_workers=False)


def register_rendezvous() -> str:
    """Register the ``nanopatch-local`` rendezvous backend with torch's registry (once) and
    return its name."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    try:
        rendezvous_handler_registry.register(BACKEND, _create_handler)
    except ValueError:
        pass  # registered already, by this function
    return BACKEND


def _create_handler(params: Any) -> Any:
    return _handler_class()(params.run_id, int(params.config.get("timeout", 600)))


@functools.cache
def _handler_class() -> type:
    """The rendezvous handler of one node: made on first use, so that importing this module
    imports nothing of torch."""
    from torch.distributed import PrefixStore
    from torch.distributed.elastic import rendezvous as rdzv

    class LoopbackRendezvous(rdzv.RendezvousHandler):
        """One node, one agent: the agent is node 0 of 1 and hosts the store on loopback."""

        def __init__(self, run_id: str, timeout_s: int) -> None:
            self.run_id = run_id
            self.timeout_s = timeout_s
            self._store: Any = None

        def get_backend(self) -> str:
            return BACKEND

        @property
        def use_agent_store(self) -> bool:
            return True

        def next_rendezvous(self) -> Any:
            if self._store is None:
                self._store = host_store(None, self.timeout_s)
            store = PrefixStore(self.run_id, self._store)
            info = getattr(rdzv, "RendezvousInfo", None)
            if info is None:  # a torch before RendezvousInfo: the older tuple
                return store, 0, 1
            return info(store, 0, 1, rdzv.RendezvousStoreInfo(LOOPBACK, self._store.port))

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return self.run_id

        def shutdown(self) -> bool:
            return True

    return LoopbackRendezvous
