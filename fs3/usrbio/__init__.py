"""fs3.usrbio: 3FS-style user-space batched zero-copy I/O (see :mod:`fs3.usrbio.api`).

Application side: :class:`Iov`, :class:`Ior`, :func:`reg_fd`, :func:`dereg_fd`,
:func:`prep_io`, :func:`submit_ios`, :func:`wait_for_ios`. Agent side (hosted by
the FUSE daemon): :class:`fs3.usrbio.agent.UsrbioAgent`.
"""

from fs3.usrbio.api import Completion, Ior, Iov, dereg_fd, prep_io, reg_fd, submit_ios, wait_for_ios
from fs3.usrbio.shm import agent_socket_path

__all__ = [
    "Completion",
    "Ior",
    "Iov",
    "agent_socket_path",
    "dereg_fd",
    "prep_io",
    "reg_fd",
    "submit_ios",
    "wait_for_ios",
]
