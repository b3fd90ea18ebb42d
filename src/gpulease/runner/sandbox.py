"""The bubblewrap sandbox around every run: what a job can see, and the check that it works.

A sandboxed run sees a root built from scratch: system directories (`/usr`, the `/bin` and
`/lib*` links or directories, a short list of `/etc` files) and the Python install its venv
points at, all read-only; the template venv read-only at its own path (its scripts name it);
its workspace read-write at `/workspace` (also its working directory and `HOME`); each of its
datasets read-only at `/data/<name>`; a private `/tmp`, `/dev/shm`, `/proc` (its own PID
namespace: it sees only its own processes) and `/dev` with only its own GPUs' device nodes.
Nothing else of the host exists in there: not the server's data directory (database, keys,
runner files, other workspaces, blobs), not other tenants' datasets, not `/root` or `/home`.

An instance's sandboxes (runs, terminals, JupyterLab, the runner's one-off commands) share
its own network namespace (runner/netns.py): outbound internet and DNS, never this host's
ports, private ranges or cloud metadata. Their processes run as the instance's own host uid
(instance_uid), without any capability and with no_new_privs, so a way out of the mount
namespace lands in an account that owns nothing but the workspace. bwrap itself runs as
root to build the mounts; `setpriv` drops to that uid just before the job's program, and
the job's loader variables (LD_PRELOAD and the like) take effect only after that.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import re
import stat
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulease.runner import netns
from gpulease.runner.cgroups import CgroupError, InstanceCgroup
from gpulease.runner.netns import InstanceNetwork, NetworkError

log = logging.getLogger(__name__)

BWRAP = "/usr/bin/bwrap"
WORKSPACE = "/workspace"
DATA_ROOT = "/data"
# The metrics SDK (read-only) and the run's metrics directory (writable), runner/metrics.py.
SDK_ROOT = "/opt/gpulease/sdk"
METRICS_ROOT = "/opt/gpulease/metrics"
JUPYTER_ROOT = "/opt/gpulease/jupyter"
PROBE_TIMEOUT_S = 20.0
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SETPRIV = "/usr/bin/setpriv"
BASH = "/bin/bash"
# Instance N's jobs run as host uid UID_BASE + N (and the same gid): far above any account
# or subordinate-uid range a distribution hands out, below 2**32 - 2 (nobody's -1 and -2).
UID_BASE = 2_000_000_000
MAX_UID = 2**32 - 3

# The namespaces every run gets; the network namespace is the instance's (runner/netns.py).
NAMESPACE_ARGS = (
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
)
_TOP_LEVEL_SYSTEM = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What of /etc a job needs: name resolution, users, TLS roots, the dynamic linker, the time
# zone, and the operator's pip configuration. Never shadow, sudoers, ssh keys or the like.
ETC_ENTRIES = (
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "passwd",
    "group",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "protocols",
    "services",
    "mime.types",
    "os-release",
    "pip.conf",
)
# /sys: only what thread pools and NUMA-aware allocators read. Not the PCI tree, whose
# resource files would map other tenants' GPUs.
SYS_ENTRIES = ("devices/system/cpu", "devices/system/node")
GPU_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# The runner's variables a job inherits in the sandbox; everything else of the runner's
# environment (which may hold the operator's credentials) stays out.
PASSED_VARIABLES = ("LANG", "LANGUAGE", "TZ", "TERM", "SSL_CERT_FILE", "SSL_CERT_DIR")
_PASSED_PREFIXES = ("LC_",)
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SIGNAL_EXIT_BASE = 128
_MAX_SIGNAL = 64
# What bwrap needs kept to drop to the job's uid with setpriv (inside, before the job).
_DROP_CAPS = ("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP")
# Variables that make the dynamic loader or glibc load code or files (glibc's list for
# secure-execution mode). nsenter, bwrap and setpriv run as root on the host's side of the
# boundary, so a job's values for them travel renamed (LOADER_PREFIX + NAME) and are put
# back only once the job's own uid is in force.
_LOADER_PREFIXES = ("LD_",)
_LOADER_VARIABLES = (
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
)
LOADER_PREFIX = "GPULEASE_SANDBOX_ENV_"
# Run as the job, first thing: put the renamed variables back, then exec the job's argv.
_RESTORE_ENV = (
    f'for n in ${{!{LOADER_PREFIX}@}}; do export "${{n#{LOADER_PREFIX}}}=${{!n}}"; unset "$n"; '
    'done; exec "$@"'
)


class _Launcher:
    """Starts processes from one thread that lives as long as the runner's process.

    bubblewrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that
    forked bwrap ends, not the process. A sandbox started from a short-lived thread (a
    stream's, or the loop that polls the server for runs and returns on a stop) is killed
    with SIGKILL as soon as that thread returns, whatever grace its job was promised.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._requests: queue.SimpleQueue[
            tuple[Sequence[str], dict[str, Any], concurrent.futures.Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="sandbox-launcher", daemon=True).start()

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        self._requests.put((argv, kwargs, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            argv, kwargs, done = self._requests.get()
            try:
                done.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # handed to the caller, which raises it
                done.set_exception(exc)


_launcher: _Launcher | None = None
_launcher_lock = threading.Lock()


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen(argv, **kwargs), forked from the process's launcher thread (made at
    the first call, again in a forked child), so that a sandbox's --die-with-parent fires
    only when the runner itself dies. Use it for every process that outlives the thread
    that asks for it: runs (runner/jobs.py) and JupyterLab (runner/jupyter.py)."""
    global _launcher
    with _launcher_lock:
        if _launcher is None or _launcher.pid != os.getpid():
            _launcher = _Launcher()
        launcher = _launcher
    return launcher.popen(argv, **kwargs)


class SandboxError(Exception):
    """The sandbox cannot be set up; the message says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def find_bwrap() -> str | None:
    """Debian's /usr/bin/bwrap, else a bwrap on PATH; None when there is none."""
    if os.access(BWRAP, os.X_OK):
        return BWRAP
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = Path(directory or ".") / "bwrap"
        if os.access(candidate, os.X_OK) and candidate.is_file():
            return str(candidate)
    return None


def _system_args(root: Path = Path("/")) -> list[str]:
    """/usr, the /bin and /lib* entries (links as links), /etc's safe subset, /sys's."""
    args = ["--ro-bind", str(root / "usr"), "/usr"]
    for name in _TOP_LEVEL_SYSTEM:
        path = root / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for name in ETC_ENTRIES:
        if (root / "etc" / name).exists():
            args += ["--ro-bind", str(root / "etc" / name), f"/etc/{name}"]
    for name in SYS_ENTRIES:
        if (root / "sys" / name).is_dir():
            args += ["--ro-bind", str(root / "sys" / name), f"/sys/{name}"]
    return args


def probe(bwrap: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a job can be isolated on this host as every run is: bubblewrap builds a
    sandbox (it runs `true` in one, with the namespaces every run gets, as an instance uid)
    in a network namespace of the instance's kind (runner/netns.py); otherwise why not, in
    words, with what to do."""
    path = bwrap or find_bwrap()
    if path is None:
        return "bubblewrap (bwrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap"
    if os.geteuid() != 0:
        return (
            "the server does not run as root, so jobs cannot get a uid and a network namespace "
            "of their own (they would run as the server's user, on its network); run it as root"
        )
    if not os.access(SETPRIV, os.X_OK):
        return f"{SETPRIV} is missing; on Debian/Ubuntu: apt-get install util-linux"
    argv = [
        path,
        *NAMESPACE_ARGS,
        *_DROP_CAPS,
        *_system_args(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--",
        *_as_uid(UID_BASE),
        "true",
    ]
    try:
        result = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} could not be run: {exc}"
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip() or f"exit code {result.returncode}"
        return (
            f"{path} cannot create a sandbox here ({detail}); it needs root or unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1, or in a container "
            "a seccomp/AppArmor profile that allows them)"
        )
    return netns.probe()


def instance_uid(instance_id: int, base: int = UID_BASE) -> int:
    """The host uid (and gid) instance_id's jobs run as: base + instance_id, one per
    instance, owned by no account. SandboxError when that leaves the uid range."""
    uid = base + instance_id
    if instance_id < 0 or base < 1000 or uid > MAX_UID:
        raise SandboxError(
            f"instance {instance_id} has no sandbox uid: {base} + {instance_id} is outside "
            f"1000..{MAX_UID}; set GPULEASE_SANDBOX_UID_BASE lower"
        )
    return uid


def _as_uid(uid: int) -> list[str]:
    """The argv prefix that drops from root in the sandbox to uid: no groups, no capability
    (bounding and inheritable sets emptied), no_new_privs (setuid files do nothing)."""
    return [
        SETPRIV,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def venv_home(env_dir: Path) -> str | None:
    """pyvenv.cfg's `home` (the base Python's bin directory) of a runner-owned venv (a
    template's, never a job's layer); None when env_dir is no venv."""
    try:
        text = (env_dir / "pyvenv.cfg").read_text()
    except OSError:
        return None
    fields = [line.partition("=") for line in text.splitlines()]
    homes = [value.strip() for key, sep, value in fields if sep and key.strip() == "home"]
    return homes[0] if homes else None


def python_install(env_dir: Path) -> Path | None:
    """The Python install a venv runs on: the prefix of pyvenv.cfg's `home` (its `bin`
    directory's parent). None when env_dir is not a venv."""
    home = venv_home(env_dir)
    if home is None:
        return None
    path = Path(home)
    return path.parent if path.name == "bin" else path


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as a job sees it: its device node's minor number and what CUDA calls it."""

    index: int  # NVML index
    minor: int  # /dev/nvidia<minor>
    uuid: str | None  # GPU-…; None when NVML could not say


def resolve_gpus(indices: Sequence[int]) -> list[GpuDevice]:
    """The instance's GPUs with their device minor numbers and UUIDs from NVML. Without
    NVML, minor = index and no UUID (the common layout, but not a guaranteed one)."""
    if not indices:
        return []
    try:
        import pynvml
    except ImportError:
        return [GpuDevice(index, index, None) for index in indices]
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError or a missing library: treat as no NVML
        log.warning("NVML is not available (%s); assuming /dev/nvidia<index>", exc)
        return [GpuDevice(index, index, None) for index in indices]
    try:
        devices = []
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            devices.append(
                GpuDevice(
                    index=index,
                    minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                )
            )
        return devices
    finally:
        pynvml.nvmlShutdown()


def gpu_device_nodes(gpus: Sequence[GpuDevice], dev: Path = Path("/dev")) -> list[Path]:
    """The device nodes a job with these GPUs gets: /dev/nvidia<minor> for each, plus the
    driver's shared control nodes, each only when it exists on the host. Nothing at all
    for a job without GPUs."""
    if not gpus:
        return []
    names = [f"nvidia{gpu.minor}" for gpu in gpus] + list(GPU_SHARED_NODES)
    return [dev / name for name in names if (dev / name).exists()]


def _covers(outer: Path, inner: Path) -> bool:
    return inner == outer or outer in inner.parents


# bwrap's options as command() emits them: how many operands each takes, which make a mount
# point, and which of those bind a host path.
_ARITY = {
    "--ro-bind": 2,
    "--bind": 2,
    "--dev-bind": 2,
    "--symlink": 2,
    "--proc": 1,
    "--dev": 1,
    "--tmpfs": 1,
    "--dir": 1,
    "--perms": 1,
    "--remount-ro": 1,
    "--hostname": 1,
    "--info-fd": 1,
    "--chdir": 1,
    "--cap-add": 1,
    "--cap-drop": 1,
}
_MOUNT_OPTIONS = {"--ro-bind", "--bind", "--dev-bind", "--symlink", "--proc", "--dev", "--tmpfs"}
_HOST_BINDS = {"--ro-bind", "--bind", "--dev-bind"}


def open_parents(options: Sequence[str]) -> list[str]:
    """bwrap options with every missing parent of a mount point made first, mode 0755:
    bwrap run as root creates them 0700, which a job's uid cannot enter (/etc, /data, the
    directories above a venv bound at its own path). A parent inside a host directory bound
    earlier exists there already and is left alone. Stops at `--`."""
    result: list[str] = []
    made = {Path("/")}
    binds: list[Path] = []
    pending: list[str] = []  # a --perms that belongs to the next option
    index = 0
    while index < len(options):
        option = options[index]
        if option == "--":
            result += [*pending, *options[index:]]
            return result
        count = _ARITY.get(option, 0)
        operands = list(options[index + 1 : index + 1 + count])
        index += 1 + count
        if option == "--perms":
            pending = [option, *operands]
            continue
        if option in _MOUNT_OPTIONS:
            target = Path(operands[-1])
            for parent in reversed(target.parents):
                if parent in made:
                    continue
                if any(_covers(bound, parent) for bound in binds):
                    break
                result += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
            made.add(target)
            if option in _HOST_BINDS:
                binds.append(target)
        result += [*pending, option, *operands]
        pending = []
    return result + pending


@dataclass(frozen=True)
class Sandbox:
    """How one instance's runs are wrapped. `private` are host paths that must never be
    visible (the runner's own directory, which lies in the server's data directory): a
    read-only bind that would contain one of them is refused with SandboxError.

    `uid`: the host uid the instance's processes run as (instance_uid); the workspace is
    handed over to it. `network`: the instance's network namespace, set up at the first
    command. Both None: jobs run as the runner, on its network (tests of the mounts alone).
    """

    workspace: Path
    env_dir: Path
    hostname: str
    datasets: Mapping[str, Path] = field(default_factory=dict)
    gpus: tuple[GpuDevice, ...] = ()
    private: tuple[Path, ...] = ()
    bwrap: str = BWRAP
    dev: Path = Path("/dev")
    # The gpulease SDK package directory, read-only at SDK_ROOT; and the one run's metrics
    # directory, writable at METRICS_ROOT (set per run with dataclasses.replace).
    sdk: Path | None = None
    metrics: Path | None = None
    # JupyterLab (runner/jupyter.py): its tools venv, read-only at its own path, and the
    # directory of its unix socket and kernelspec, writable at JUPYTER_ROOT.
    tools_env: Path | None = None
    jupyter_dir: Path | None = None
    uid: int | None = None
    network: InstanceNetwork | None = None
    # The instance's CPU and memory share (runner/cgroups.py): every command starts in it.
    cgroup: InstanceCgroup | None = None
    # Workspaces already handed over to uid, shared by the copies dataclasses.replace makes
    # (runner/metrics.py, runner/jupyter.py): the whole tree is walked once per runner.
    handed_over: set[Path] = field(default_factory=set, compare=False, repr=False)

    def command(
        self, argv: Sequence[str], *, info_fd: int | None = None, terminal: bool = False
    ) -> list[str]:
        """The command line that runs argv inside the sandbox: `nsenter --net=…` into the
        instance's network, bwrap, then (inside) setpriv down to the instance's uid. Every
        process of an instance starts through here: runs (runner/jobs.py), terminals
        (runner/streams.py), JupyterLab (runner/jupyter.py) and the runner's own one-off
        commands such as `pip freeze` (runner/oneoff.py's in_sandbox: use that, with
        Sandbox.environment for the env, to run a short command and read its output).

        Before returning it hands the writable directories over to the instance's uid
        (the workspace tree, chowned without following links; the metrics and JupyterLab
        directories shared root:uid with the sticky bit) and sets the network up if need
        be, so call it just before spawning. The environment given to the spawned process
        must come from Sandbox.environment.

        info_fd: bwrap writes {"child-pid": N} there (the host pid of the sandbox's init,
        whose session and process group the job's processes share) and closes it.
        terminal: argv runs on a PTY of its own (runner/streams.py) and keeps it as
        controlling terminal, so no --new-session (TIOCSTI can only reach that PTY, not the
        runner's terminal)."""
        namespaces = [a for a in NAMESPACE_ARGS if not (terminal and a == "--new-session")]
        prefix: list[str] = []
        if self.cgroup is not None:
            try:
                self.cgroup.create()
            except CgroupError as exc:
                raise SandboxError(f"the instance's CPU and memory share: {exc.message}") from exc
            prefix = self.cgroup.enter_args()
        if self.network is not None:
            try:
                prefix += self.network.enter_args()
            except NetworkError as exc:
                raise SandboxError(f"the instance's network: {exc.message}") from exc
        args = [*namespaces]
        if self.uid is not None:
            args += _DROP_CAPS
        args += ["--hostname", self.hostname]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        args += _system_args()
        if self.network is not None:
            args += ["--ro-bind", str(self.network.resolv_conf), "/etc/resolv.conf"]
        # /tmp first: binds below may lie under /tmp on the host (tests, odd setups).
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
        for node in gpu_device_nodes(self.gpus, self.dev):
            args += ["--dev-bind", str(node), f"/dev/{node.name}"]
        for source in self._read_only_sources():
            args += ["--ro-bind", str(source), str(source)]
        args += ["--bind", str(self.workspace), WORKSPACE]
        for name, source in sorted(self.datasets.items()):
            if not _DATASET_NAME.match(name):
                raise SandboxError(f"dataset name {name!r} cannot be a directory under /data")
            self._check_not_private(source, f"dataset {name}")
            args += ["--ro-bind", str(source), f"{DATA_ROOT}/{name}"]
        if self.sdk is not None:
            args += ["--ro-bind", str(self.sdk), SDK_ROOT]
        if self.metrics is not None:
            args += ["--bind", str(self.metrics), METRICS_ROOT]
        if self.tools_env is not None:
            self._check_not_private(self.tools_env, "the JupyterLab environment")
            args += ["--ro-bind", str(self.tools_env), str(self.tools_env)]
        if self.jupyter_dir is not None:
            args += ["--bind", str(self.jupyter_dir), JUPYTER_ROOT]
        # The root itself (where /etc, /data and the bind points live) is read-only too.
        args += ["--remount-ro", "/", "--chdir", WORKSPACE, "--"]
        if self.uid is not None:
            args += _as_uid(self.uid)
            self._hand_over(self.uid)
        args += [BASH, "-c", _RESTORE_ENV, "gpulease-sandbox", *argv]
        return [*prefix, self.bwrap, *open_parents(args)]

    def close(self) -> None:
        """Called once the instance's runs, terminals and JupyterLab are stopped: kill
        whatever is still in the instance's network namespace (nothing should be: each
        sandbox's PID namespace ends with its command; every process of the instance is in
        that namespace, and only they are), then take the network down. Idempotent; a
        command after close() fails with SandboxError."""
        if self.network is not None:
            self.network.close()
        if self.cgroup is not None:
            self.cgroup.remove()

    def _hand_over(self, uid: int) -> None:
        """The workspace tree to uid, at the first command (what the runner put there while
        preparing: the workdir, the venv layer); the per-run metrics directory and
        JupyterLab's directory shared: root-owned, group uid, 1770 (the job creates its
        files there but cannot touch the runner's)."""
        try:
            if self.workspace not in self.handed_over:
                give_tree(self.workspace, uid)
                self.handed_over.add(self.workspace)
            for shared in (self.metrics, self.jupyter_dir):
                if shared is not None:
                    os.chown(shared, 0, uid, follow_symlinks=False)
                    os.chmod(shared, 0o1770, follow_symlinks=False)
        except OSError as exc:
            raise SandboxError(f"the workspace cannot be given to the instance: {exc}") from exc

    def _read_only_sources(self) -> list[Path]:
        sources = [self.env_dir]
        prefix = python_install(self.env_dir)
        if prefix is not None and not _covers(Path("/usr"), prefix):
            sources.append(prefix)
        for source in sources:
            self._check_not_private(source, "the Python environment")
        return sources

    def _check_not_private(self, source: Path, what: str) -> None:
        resolved = source.resolve()
        for private in self.private:
            if _covers(resolved, private.resolve()):
                raise SandboxError(
                    f"{what} at {source} contains {private}, which jobs must not see; move "
                    "it out of the server's data directory (GPULEASE_HOME)"
                )

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """A run's environment as it must look inside: HOME and PWD are /workspace, TMPDIR
        the private /tmp, CUDA_VISIBLE_DEVICES the GPUs' UUIDs (only their device nodes
        exist in here, so CUDA numbers them from 0; UUIDs name them whatever the order), and
        host paths under the workspace in PATH and VIRTUAL_ENV (the instance's venv layer)
        under /workspace. Loader variables (LD_PRELOAD, LD_LIBRARY_PATH, …) are renamed
        (LOADER_PREFIX + NAME) so that nothing running as root on the way in honours them;
        the command line from Sandbox.command restores them as the job."""
        result = dict(env)
        result.update(HOME=WORKSPACE, PWD=WORKSPACE, TMPDIR="/tmp")
        if "PATH" in result:
            result["PATH"] = ":".join(self.inside(entry) for entry in result["PATH"].split(":"))
        if "VIRTUAL_ENV" in result:
            result["VIRTUAL_ENV"] = self.inside(result["VIRTUAL_ENV"])
        if self.gpus:
            result["CUDA_VISIBLE_DEVICES"] = ",".join(
                gpu.uuid or str(gpu.index) for gpu in self.gpus
            )
        for key in list(result):
            if key.startswith(LOADER_PREFIX):
                del result[key]  # only this function may name them
        for key in list(result):
            if key.startswith(_LOADER_PREFIXES) or key in _LOADER_VARIABLES:
                result[LOADER_PREFIX + key] = result.pop(key)
        return result

    def inside(self, path: str | Path) -> str:
        """A host path as the sandbox sees it: under the workspace it is under /workspace;
        other paths the sandbox shows are bound at their own path."""
        text, root = str(path), str(self.workspace).rstrip("/")
        if text == root or text.startswith(root + "/"):
            return WORKSPACE + text[len(root) :]
        return text


def give_tree(root: Path, uid: int) -> None:
    """chown root and everything under it to uid:uid, following no link and trusting no
    name: a directory is entered through the descriptor it was opened with (os.fwalk), and
    an entry is changed by name relative to it without following a link. A non-directory
    with other hard links is skipped: the job may have linked a file of the host's there
    (where fs.protected_hardlinks is off), and such a file must not become the job's."""
    _give(root, None, uid)
    for _, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in dirs:
            _give(Path(name), dir_fd, uid)
        for name in files:
            _give(Path(name), dir_fd, uid)


def _give(path: Path, dir_fd: int | None, uid: int) -> None:
    try:
        info = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # removed meanwhile (by the job)
    if info.st_uid == uid and info.st_gid == uid:
        return
    if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
        log.warning("not giving %s to uid %d: it has %d links", path, uid, info.st_nlink)
        return
    with contextlib.suppress(FileNotFoundError):
        os.chown(path, uid, uid, dir_fd=dir_fd, follow_symlinks=False)


def base_environment(runner_env: Mapping[str, str]) -> dict[str, str]:
    """What a sandboxed job inherits from the runner: locale, time zone, terminal, proxies
    and CA settings, and a system PATH. The rest of the runner's environment stays out."""
    env = {"PATH": SANDBOX_PATH}
    for key, value in runner_env.items():
        if (
            key in PASSED_VARIABLES
            or key.startswith(_PASSED_PREFIXES)
            or key.lower() in _PROXY_VARIABLES
        ):
            env[key] = value
    return env


def exit_code_from_sandbox(code: int) -> int:
    """bwrap reports a job killed by signal N as exit code 128+N; the protocol says -N."""
    if _SIGNAL_EXIT_BASE < code <= _SIGNAL_EXIT_BASE + _MAX_SIGNAL:
        return -(code - _SIGNAL_EXIT_BASE)
    return code
