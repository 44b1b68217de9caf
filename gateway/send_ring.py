"""Many sends to many sockets in one system call: a Linux io_uring used for nothing else.

The gateway answers a loop turn's requests on as many connections. Written one ``write`` at
a time, each answer wakes its client, and on a machine with few CPUs the client often runs
at once on the gateway's own CPU, before the gateway's next write: the turn's answers and the
clients' next requests take turns on one CPU while another idles. Submitted together, the
sends all happen inside one system call, and the clients they wake run after it, spread
over the CPUs (docs/performance.md, "A turn's answers in one system call").

Python's standard library has no io_uring, and the binding on PyPI did not run on this
project's machines, so the little needed is here: the ring is set up and mapped once, and
each call writes one submission entry per send (``IORING_OP_SEND`` with ``MSG_DONTWAIT``, so
a send that would block completes at once with ``EAGAIN`` rather than waiting in the kernel)
and reads the completions back. The entries point into a buffer the caller keeps alive for
the call. Where the kernel refuses a ring (before Linux 5.6, ``kernel.io_uring_disabled``, a
container's seccomp profile), ``SendRing.open`` returns None and the caller writes as before.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import mmap
import platform
import struct
import sys

log = logging.getLogger(__name__)

ENTRIES = 256   # sends per system call at most; more are submitted in several
_SYS_IO_URING_SETUP, _SYS_IO_URING_ENTER = 425, 426   # the generic table's, x86-64's and arm64's
_IORING_OP_SEND = 26
_IORING_FEAT_SINGLE_MMAP = 1
_IORING_OFF_SQES = 0x10000000
_MSG_DONTWAIT, _MSG_NOSIGNAL = 0x40, 0x4000
# struct io_uring_sqe (64 bytes) as a send fills it: opcode, flags, ioprio, fd, off, addr, len,
# msg_flags, user_data, then buf_index, personality, splice_fd_in, addr3 and padding left zero.
_SQE = struct.Struct("=BBHiQQIIQ24x")
_CQE = struct.Struct("=QiI")     # struct io_uring_cqe: user_data, res, flags
_SQE_SIZE, _CQE_SIZE = 64, 16
_ATTEMPTS = 100   # calls to the kernel a send() makes at most to submit its entries


class _SqOffsets(ctypes.Structure):   # struct io_sqring_offsets
    _fields_ = [("head", ctypes.c_uint32), ("tail", ctypes.c_uint32), ("ring_mask", ctypes.c_uint32),
                ("ring_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("dropped", ctypes.c_uint32),
                ("array", ctypes.c_uint32), ("resv1", ctypes.c_uint32), ("user_addr", ctypes.c_uint64)]


class _CqOffsets(ctypes.Structure):   # struct io_cqring_offsets
    _fields_ = [("head", ctypes.c_uint32), ("tail", ctypes.c_uint32), ("ring_mask", ctypes.c_uint32),
                ("ring_entries", ctypes.c_uint32), ("overflow", ctypes.c_uint32), ("cqes", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("resv1", ctypes.c_uint32), ("user_addr", ctypes.c_uint64)]


class _Params(ctypes.Structure):   # struct io_uring_params
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32),
                ("features", ctypes.c_uint32), ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3),
                ("sq_off", _SqOffsets), ("cq_off", _CqOffsets)]


def _syscall():
    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.syscall
    call.restype = ctypes.c_long
    return call


class SendRing:
    """A submission ring of ``ENTRIES`` sends and its completion ring, mapped into this process.

    Used from one thread. Its memory is read and written with plain loads and stores: the kernel
    reads the submissions and posts the completions inside ``io_uring_enter``, on this thread,
    so the system call orders them. A call that does not end as expected (an entry left
    unsubmitted, a completion missing) leaves the ring ``broken``: it is not used again.
    """

    def __init__(self, fd: int, params: _Params, syscall) -> None:
        self.fd = fd
        self.broken = False
        self._syscall = syscall
        self._generation = 0   # in each entry's user_data, so that a completion is matched to its call
        sq, cq = params.sq_off, params.cq_off
        size = max(sq.array + params.sq_entries * 4, cq.cqes + params.cq_entries * _CQE_SIZE)
        shared = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        both = mmap.PROT_READ | mmap.PROT_WRITE
        self._rings = mmap.mmap(fd, size, shared, both, offset=0)
        self._entries = mmap.mmap(fd, params.sq_entries * _SQE_SIZE, shared, both, offset=_IORING_OFF_SQES)
        words = memoryview(self._rings).cast("I")
        self._words = words
        self._sq_head, self._sq_tail = sq.head // 4, sq.tail // 4
        self._cq_head, self._cq_tail = cq.head // 4, cq.tail // 4
        self._sq_mask, self._cq_mask = words[sq.ring_mask // 4], words[cq.ring_mask // 4]
        self._cqes = cq.cqes
        self.capacity = params.sq_entries
        array = sq.array // 4
        for slot in range(params.sq_entries):   # entry i always sits in slot i
            words[array + slot] = slot

    @classmethod
    def open(cls) -> SendRing | None:
        """A ring that sends, or None where this kernel or its sandbox offers none (logged)."""
        machine = platform.machine()
        if not sys.platform.startswith("linux") or machine in ("alpha", "ia64") or machine.startswith("mips"):
            return None   # (those three number their system calls otherwise)
        fd = -1
        try:
            syscall = _syscall()
            params = _Params()
            fd = syscall(_SYS_IO_URING_SETUP, ENTRIES, ctypes.byref(params))
            if fd < 0:
                _refused(f"io_uring is not available ({os.strerror(ctypes.get_errno())})")
                return None
            if not params.features & _IORING_FEAT_SINGLE_MMAP:
                _refused("this kernel's io_uring is older than Linux 5.4", fd)
                return None
            ring = cls(fd, params, syscall)
            # Linux 5.4 and 5.5 have rings but not their sends (IORING_OP_SEND came in 5.6): a send
            # to no socket must say EBADF, not EINVAL (an operation this kernel does not know).
            if ring.send([(-1, 0, 0)]) != [-errno.EBADF]:
                ring.close()
                _refused("this kernel's io_uring cannot send (Linux 5.6 or later can)")
                return None
            return ring
        except Exception as error:   # an optional speed-up: whatever fails, the gateway writes as before
            _refused(f"io_uring could not be set up ({error})", fd)
            return None

    def send(self, sends: list[tuple[int, int, int]]) -> list[int | None]:
        """Send each ``(socket fd, buffer address, length)``; for each, the bytes sent or -errno
        (``-EAGAIN``: no room, or not submitted; nothing sent), or None when what was sent is
        unknown (a completion that did not come with the call: the ring is then ``broken``, and
        the send may still read its buffer later).

        At most ``capacity`` sends. Each completes before the call returns: none waits for room.
        """
        count = len(sends)
        words = self._words
        tail = words[self._sq_tail]
        if self.broken or words[self._sq_head] != tail or words[self._cq_head] != words[self._cq_tail]:
            self.broken = True   # something of an earlier call is still in the rings: none of it is trusted
            return [-errno.EAGAIN] * count
        self._generation = (self._generation + 1) & 0xFFFFFFFF
        tag = self._generation << 32
        entries, mask = self._entries, self._sq_mask
        for index, (fd, address, length) in enumerate(sends):
            _SQE.pack_into(entries, ((tail + index) & mask) * _SQE_SIZE, _IORING_OP_SEND, 0, 0, fd, 0, address,
                           length, _MSG_DONTWAIT | _MSG_NOSIGNAL, tag | index)
        words[self._sq_tail] = (tail + count) & 0xFFFFFFFF
        results: list[int | None] = [None] * count
        to_submit = count
        for _ in range(_ATTEMPTS):   # submitted with no wait: each send completes as it is submitted
            entered = self._syscall(_SYS_IO_URING_ENTER, self.fd, to_submit, 0, 0, None, 0)
            if entered >= 0:
                to_submit -= min(entered, to_submit)
            elif ctypes.get_errno() not in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                break
            if not to_submit:
                break
        if to_submit:   # never handed to the kernel, which reads the tail only inside io_uring_enter: take them back
            words[self._sq_tail] = (tail + count - to_submit) & 0xFFFFFFFF
            for index in range(count - to_submit, count):
                results[index] = -errno.EAGAIN
            self.broken = True
        if self._completed(results, tag) < count - to_submit:   # a send left waiting in the kernel: never seen
            self.broken = True
        return results

    def _completed(self, results: list[int | None], tag: int) -> int:
        """Read the completions of this call there are into ``results``; how many."""
        words, cqes, mask = self._words, self._cqes, self._cq_mask
        head, end = words[self._cq_head], words[self._cq_tail]
        seen = 0
        while head != end:
            user_data, result, _ = _CQE.unpack_from(self._rings, cqes + (head & mask) * _CQE_SIZE)
            index = user_data - tag
            if 0 <= index < len(results) and results[index] is None:
                results[index] = result
                seen += 1
            head = (head + 1) & 0xFFFFFFFF
        words[self._cq_head] = head
        return seen

    def close(self) -> None:
        self._words.release()
        self._rings.close()
        self._entries.close()
        os.close(self.fd)


def _refused(why: str, fd: int = -1) -> None:
    """Why there is no ring, said once; the descriptor of a ring set up in vain closed."""
    if fd >= 0:
        os.close(fd)
    log.info("answers are written one system call each: %s", why)
