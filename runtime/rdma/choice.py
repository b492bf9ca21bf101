"""Which transport moves the bytes of one transfer: a pure function of where the two
memories are (process, host, CPU or CUDA) and what this process can use."""

from __future__ import annotations

from typing import Optional

from .errors import RDMAError

__all__ = ["TRANSPORTS", "choose_transport"]

#: the transports `choose_transport` may name ("+cuda-staged" is added by the caller when
#: its own memory is CUDA memory moved through pinned host buffers)
TRANSPORTS = ("local", "vm", "cuda-ipc", "tcp", "ibverbs")


def choose_transport(*, mode: str, same_process: bool, same_host: bool, remote_cuda: bool,
                     cuda_here: bool, vm_ok: bool, vm_refused: Optional[str] = None,
                     ib_ok: bool = False, gpudirect: bool = False,
                     where: str = "the buffer") -> str:
    """The transport for one transfer; raises RDMAError when a forced one cannot work.

    mode: MONARCH_RDMA_TRANSPORT ("auto", "vm", "tcp", "ibverbs"); remote_cuda: the
    owner's buffer is CUDA memory; cuda_here: this process can open CUDA IPC handles;
    gpudirect: the owner registered its CUDA buffer with its NIC (GPUDirect RDMA)."""
    if mode == "vm":
        if not same_host:
            raise RDMAError("transport 'vm' requested but the buffer's owner is on another host")
        if remote_cuda:
            raise RDMAError(
                f"transport 'vm' requested but {where} is in CUDA memory, which "
                "process_vm_readv cannot read; use MONARCH_RDMA_TRANSPORT=auto (CUDA IPC on "
                "this host) or tcp (staged through host memory)")
        if not vm_ok:
            raise RDMAError(f"transport 'vm' requested but process_vm_readv is refused: "
                            f"{vm_refused}")
        return "vm"
    if mode == "ibverbs":
        if remote_cuda and not gpudirect:
            raise RDMAError(f"transport 'ibverbs' requested but {where} is in CUDA memory "
                            "and its owner did not register it with its NIC (GPUDirect RDMA "
                            "is off: MONARCH_RDMA_GPUDIRECT=1 there); use auto or tcp")
        return "ibverbs"
    if mode == "tcp":
        return "tcp"
    if mode != "auto":
        raise RDMAError(f"unknown RDMA transport {mode!r}")
    if same_process:
        return "local"
    if same_host and remote_cuda:
        return "cuda-ipc" if cuda_here else "tcp"
    if same_host:
        return "vm" if vm_ok else "tcp"
    if ib_ok and (gpudirect or not remote_cuda):
        return "ibverbs"
    return "tcp"
