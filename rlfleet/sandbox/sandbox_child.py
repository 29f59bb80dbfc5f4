"""The sandboxed child: confine this fresh interpreter, then run `solution.py`.

Started by `rlfleet.sandbox.runner` as `python -I sandbox_child.py CONFIG` in a
new session whose cwd is a fresh temporary directory. It reads only the standard
library, so it runs under any interpreter. In order, it:

1. leaves the network: a new, empty network namespace (only a loopback that is
   down) when the kernel allows it (root, or unprivileged user namespaces);
2. sets resource limits: CPU seconds, address space, file size, open files, no core;
3. when running as root, becomes `nobody`, keeping only CAP_DAC_READ_SEARCH so the
   interpreter's own files stay readable, and forbids new processes and threads
   (RLIMIT_NPROC = 0, which the kernel enforces for every user but root);
4. installs an audit hook that refuses sockets, new processes, ctypes, and
   writes, renames or deletions outside the working directory;
5. runs the solution as `__main__`.

Exit codes: the solution's own, 101 after a MemoryError, 102 after a refused action,
103 when the confinement itself could not be set up (the parent then raises rather
than let the solution be judged unconfined or scored as if it had failed).
"""
import json
import os
import resource
import sys

EXIT_MEMORY = 101
EXIT_BLOCKED = 102
EXIT_SETUP = 103
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_KEEPCAPS = 8
CAP_DAC_READ_SEARCH = 2
NOBODY = 65534

_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym",
                   "ctypes.cdata", "ctypes.call_function"}
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "os.chflags", "os.mkfifo", "os.mknod",
                "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move",
                "shutil.rmtree", "shutil.chown"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxViolation(PermissionError):
    """An action the sandbox refuses."""


def _libc():
    import ctypes
    return ctypes, ctypes.CDLL(None, use_errno=True)


def leave_network() -> bool:
    _, libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return True
    return os.geteuid() != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0


def set_limits(cfg: dict) -> None:
    cpu = int(cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(cfg["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = int(cfg["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def become_nobody() -> None:
    ctypes, libc = _libc()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]  # noqa: RUF012 - ctypes wants a list

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),  # noqa: RUF012
                    ("inheritable", ctypes.c_uint32)]

    if libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS) failed")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    keep = 1 << CAP_DAC_READ_SEARCH
    data = (Data * 2)(Data(keep, keep, 0), Data(0, 0, 0))
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _inside(path: object, root: str) -> bool:
    if isinstance(path, int):
        return True  # an already-open descriptor
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    real = os.path.realpath(os.fspath(path))
    return real == root or real.startswith(root + os.sep)


def install_guard(root: str) -> None:
    def guard(event: str, args: tuple) -> None:
        if event.startswith("socket."):
            raise SandboxViolation(f"sandbox: network access refused ({event})")
        if event in _PROCESS_EVENTS:
            raise SandboxViolation(f"sandbox: {event} refused")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and path is not None and not _inside(path, root):
                raise SandboxViolation(f"sandbox: writing {path!r} outside the working directory refused")
        elif event in _PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg, root):
                    raise SandboxViolation(f"sandbox: {event} on {arg!r} outside the working "
                                           "directory refused")

    sys.addaudithook(guard)


def run_solution(path: str) -> None:
    with open(path) as f:
        code = compile(f.read(), "solution.py", "exec")
    sys.argv = ["solution.py"]
    namespace = {"__name__": "__main__", "__file__": "solution.py", "__builtins__": __builtins__}
    try:
        exec(code, namespace)  # noqa: S102 - running the solution is the point
    except MemoryError:
        _exit_with(EXIT_MEMORY, "MemoryError: the solution exceeded its memory limit\n")
    except SandboxViolation as exc:
        _exit_with(EXIT_BLOCKED, f"{exc}\n")


def _exit_with(code: int, message: str) -> None:
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001, S110 - nothing more can be done
        pass
    os.write(2, message.encode())
    os._exit(code)


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    os.remove(sys.argv[1])
    root = os.path.realpath(cfg["workdir"])
    try:
        if cfg["network_namespace"] and not leave_network():
            raise OSError("could not create a network namespace")
        set_limits(cfg)
        if os.geteuid() == 0:
            become_nobody()
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        os.chdir(root)
        if cfg["audit_hook"]:
            install_guard(root)
    except Exception as exc:  # noqa: BLE001 - reported to the parent by the exit code
        _exit_with(EXIT_SETUP, f"sandbox setup failed: {type(exc).__name__}: {exc}\n")
    run_solution(os.path.join(root, "solution.py"))


if __name__ == "__main__":
    main()
