"""How zt.shard finds its job however the script was launched, and the torch.distributed process
group that comes with it. Three launches, told apart by the environment:

- zerorun (ZEROD_RANK or ZEROD_WORLD_SIZE set, or rank=/world_size= given to zt.shard): the job,
  rank, world size and endpoint are zerorun's ZEROD_* variables (or the arguments), as before.
- torchrun (RANK or WORLD_SIZE set): rank and world size are RANK and WORLD_SIZE. The ranks meet
  through torch.distributed's rendezvous at MASTER_ADDR:MASTER_PORT (the default process group,
  made here when the script has not made one), and rank 0 tells the others, through its store,
  the coordinator and the job.
- a single process (neither): world 1, rank 0.

The coordinator is $ZEROD_ENDPOINT (or endpoint=) when set, else an embedded zerod that rank 0
starts for the run: on a Unix socket in a private temporary folder when every rank is on its host
(LOCAL_WORLD_SIZE == WORLD_SIZE), else on rank 0's address toward MASTER_ADDR with a port the
system picks (plaintext TCP: the job's token, sent through the rendezvous store, guards it). It
lives until every rank has left the job: rank 0 waits for them at exit, then stops it (and it dies
with rank 0's process, through setpriv --pdeathsig).
"""

import atexit
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import torch
import torch.distributed as dist

from zerod._native import FAILED_PRECONDITION, INVALID_ARGUMENT, ZerodError, program_path

# torch's own default for a rendezvous: rank 0 may reach zt.shard long after the others.
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=30)
ZEROD_START_TIMEOUT_S = 60.0  # the embedded zerod binds its socket
EXIT_WAIT_S = 300.0  # rank 0 at exit, for the others to leave the embedded zerod's job
STOP_TIMEOUT_S = 10.0  # the embedded zerod drains after SIGTERM

_TORCHRUN = ("RANK", "WORLD_SIZE")
_state = None  # this process's _Launch


def _env_int(name, low):
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ZerodError(INVALID_ARGUMENT, f"zerod: {name}={text!r} is not an integer >= {low}")
    return value


class _Launch:
    """What this process knows of its launch, decided at the first question."""

    def __init__(self):
        env = os.environ
        self.kind = "single"
        if "ZEROD_RANK" in env or "ZEROD_WORLD_SIZE" in env:
            self.kind = "zerorun"
        elif any(n in env for n in _TORCHRUN):
            self.kind = "torchrun"
            missing = [n for n in _TORCHRUN if n not in env]
            if missing:
                given = [n for n in _TORCHRUN if n in env]
                raise ZerodError(INVALID_ARGUMENT, (
                    f"zerod: {given[0]} is set but not {missing[0]}: torchrun sets RANK, "
                    "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; set them all, or "
                    "neither for a single process"))
        self.rank, self.world = 0, 1
        if self.kind == "torchrun":
            self.rank, self.world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
            if self.rank >= self.world:
                raise ZerodError(INVALID_ARGUMENT, (
                    f"zerod: RANK={self.rank} is not below WORLD_SIZE={self.world}"))
        self.local_world = self.world
        if self.kind == "torchrun" and "LOCAL_WORLD_SIZE" in env:
            self.local_world = _env_int("LOCAL_WORLD_SIZE", 1)
        elif self.kind == "torchrun" and self.world > 1:
            self.local_world = 0  # unknown: the ranks may be on several hosts
        self.store = None  # the rendezvous store, prefixed for zerod (torchrun, world > 1)
        self.coordinator = None  # the embedded zerod, on the rank that started it
        self.joins = 0  # zt.shard calls that reached the rendezvous
        self.counted = 0  # the last join this rank said it left
        atexit.register(self._at_exit)

    # ---- the process group ---------------------------------------------------------------------

    def ensure_group(self):
        """torch.distributed's default group (gloo), from the launch's rendezvous, unless the
        script made one (then it must have this rank and world size)."""
        if dist.is_initialized():
            check_group(self.rank, self.world)
            return
        if self.world == 1:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            return
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
        if missing:
            raise ZerodError(INVALID_ARGUMENT, (
                f"zerod: WORLD_SIZE={self.world} but {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set: the ranks meet at "
                "MASTER_ADDR:MASTER_PORT (rank 0's host, a free port), as torchrun sets them"))
        dist.init_process_group("gloo", init_method="env://", rank=self.rank,
                                world_size=self.world, timeout=RENDEZVOUS_TIMEOUT)

    def _rendezvous_store(self):
        if self.store is None:
            getter = getattr(dist.distributed_c10d, "_get_default_store", None)
            if getter is None:
                raise ZerodError(FAILED_PRECONDITION, (
                    f"zerod: this torch ({torch.__version__}) does not expose the default process "
                    "group's store, through which the ranks find their coordinator; launch with "
                    "zerorun"))
            # Keys of this attempt only: torchrun's own store outlives a restart of the workers.
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            self.store = dist.PrefixStore(f"zerod/{attempt}/", getter())
        return self.store

    # ---- the coordinator -----------------------------------------------------------------------

    def session_options(self, job, endpoint):
        """The job, rank, world size, endpoint, token and peer address a torchrun rank or a
        single process joins with (a collective under torchrun: rank 0 answers the others)."""
        self.ensure_group()
        self.joins += 1
        store = self._rendezvous_store() if self.world > 1 else None
        key = f"coordinator/{self.joins}"
        if self.rank == 0:
            try:
                found = self._coordinator(job, endpoint)
            except BaseException as e:
                if store is not None:
                    store.set(key, json.dumps({"error": str(e)}))
                raise
            if store is not None:
                store.set(key, json.dumps(found))
        else:
            store.wait([key], RENDEZVOUS_TIMEOUT)
            found = json.loads(store.get(key))
            if "error" in found:
                raise ZerodError(FAILED_PRECONDITION, (
                    f"zerod: rank 0 found no coordinator for the job: {found['error']}"))
        options = {"job": found["job"], "rank": self.rank, "world_size": self.world,
                   "endpoint": endpoint or os.environ.get("ZEROD_ENDPOINT") or found["endpoint"]}
        if found.get("token"):
            options["job_token"] = found["token"]
        if self.local_world != self.world:
            options["peer_address"] = _own_address()
        return options

    def _coordinator(self, job, endpoint):
        """Rank 0: {"endpoint", "job", "token"}: the configured zerod, else an embedded one."""
        endpoint = endpoint or os.environ.get("ZEROD_ENDPOINT")
        if not endpoint:
            if self.coordinator is None:
                tcp = None if self.local_world == self.world else _own_address()
                self.coordinator = _EmbeddedZerod(tcp)
            endpoint = self.coordinator.endpoint
        job = job or os.environ.get("ZEROD_JOB")
        if job:  # a named job: its token is the user's (client/credentials.h)
            return {"endpoint": endpoint, "job": job, "token": None}
        name = "torchrun" if self.kind == "torchrun" else "python"
        return {"endpoint": endpoint, "job": f"{name}-{uuid.uuid4().hex[:12]}",
                "token": secrets.token_hex(32)}

    def left(self):
        """This rank no longer needs the coordinator of its latest join (it left, or exits)."""
        if self.counted == self.joins or self.store is None:
            self.counted = self.joins
            return
        self.counted = self.joins
        try:
            self.store.add(f"left/{self.joins}", 1)
        except Exception:  # rank 0, which serves the store, is gone: nobody waits
            pass

    def _at_exit(self):
        self.left()
        if self.coordinator is None:
            return
        if self.store is not None and self.joins:
            key = f"left/{self.joins}"
            deadline = time.monotonic() + EXIT_WAIT_S
            try:
                while self.store.add(key, 0) < self.world and time.monotonic() < deadline:
                    time.sleep(0.05)
            except Exception:
                pass
        self.coordinator.stop()


class _EmbeddedZerod:
    """A zerod for this run only, a child of this process: its state in a private temporary
    folder removed at the end, a Unix socket there (tcp_host None) or a TCP port on tcp_host.
    It gets SIGTERM when the thread that started it ends (setpriv --pdeathsig): zt.shard is called
    from the thread that trains, which lives as long as the run."""

    def __init__(self, tcp_host):
        binary = program_path("zerod")
        if binary is None:
            raise ZerodError(FAILED_PRECONDITION, (
                "zerod: no zerod program to start as the run's coordinator (install the package "
                "with pip, or build it: scripts/build.sh zerod); or set ZEROD_ENDPOINT to a "
                "running zerod"))
        self.folder = tempfile.mkdtemp(prefix="zerod-")
        self.log = os.path.join(self.folder, "zerod.log")
        args = [binary, "--data-dir", os.path.join(self.folder, "data"), "--log-level", "warn",
                "--sync", "normal"]
        port_file = os.path.join(self.folder, "port")
        if tcp_host is None:
            ready = os.path.join(self.folder, "zerod.sock")
            args += ["--socket", ready, "--listen", ""]
            self.endpoint = f"unix://{ready}"
        else:
            ready = port_file
            bracketed = f"[{tcp_host}]" if ":" in tcp_host else tcp_host
            args += ["--socket", "", "--listen", f"{bracketed}:0", "--port-file", port_file]
            if not ipaddress.ip_address(tcp_host).is_loopback:
                args.append("--allow-plaintext-tcp")
        setpriv = shutil.which("setpriv")
        if setpriv:  # it dies with this process, even one killed by SIGKILL
            args = [setpriv, "--pdeathsig", "TERM", "--", *args]
        # Its own session: a Ctrl-C meant for the trainers leaves it to answer their Leave.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROD_")}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + ZEROD_START_TIMEOUT_S
        # The socket appears once bound; the port file is written once every listener is.
        while not (os.path.exists(ready) and (tcp_host is None or os.path.getsize(ready) > 0)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(keep=True)
                raise ZerodError(FAILED_PRECONDITION, (
                    f"zerod: the embedded zerod did not start ({' '.join(args)}): "
                    f"{self._log_tail()}"))
            time.sleep(0.02)
        if tcp_host is not None:
            with open(port_file) as f:
                self.endpoint = f"{bracketed}:{int(f.read())}"

    def _log_tail(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-2000:].strip() or "(no output)"
        except OSError:
            return "(no log)"

    def stop(self, keep=False):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def _own_address():
    """The address other hosts reach this one by: the one on the route to MASTER_ADDR (no packet
    is sent), else what this host's name resolves to (a group the script made without
    MASTER_ADDR)."""
    host = os.environ.get("MASTER_ADDR")
    try:
        if not host:
            return socket.getaddrinfo(socket.gethostname(), None)[0][4][0]
        family, kind, _, _, target = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind) as s:
            s.connect(target)
            return s.getsockname()[0]
    except OSError as e:
        raise ZerodError(INVALID_ARGUMENT, (
            f"zerod: no address of this host for the other ranks (MASTER_ADDR={host!r}): {e}"))


def check_group(rank, world):
    """The default process group the script made must be the job's ranks."""
    have = (dist.get_rank(), dist.get_world_size())
    if have != (rank, world):
        raise ZerodError(FAILED_PRECONDITION, (
            f"zerod: torch.distributed's default group has this process as rank {have[0]} of "
            f"{have[1]}, but the zerod job as rank {rank} of {world}: initialize it with the "
            "job's rank and world size, or let zt.shard make it"))


def _current():
    global _state
    if _state is None:
        _state = _Launch()
    return _state


def session_options(job, rank, world_size, endpoint):
    """What zt.shard's session joins with: the arguments given, else the launch's (above)."""
    launch = _current()
    if rank is None and world_size is None and launch.kind != "zerorun":
        return launch.session_options(job, endpoint)
    given = {"job": job, "rank": rank, "world_size": world_size, "endpoint": endpoint}
    needed = (("job", "ZEROD_JOB"), ("world_size", "ZEROD_WORLD_SIZE"),
              ("endpoint", "ZEROD_ENDPOINT"))
    for name, variable in needed:
        if given[name] is None and not os.environ.get(variable):
            raise ZerodError(INVALID_ARGUMENT, (
                f"zt.shard: {variable} is not set (zerorun sets it), and {name}= was not given; "
                "launch with zerorun, pass job=, rank=, world_size= and endpoint=, or unset "
                "ZEROD_RANK and ZEROD_WORLD_SIZE to launch with torchrun or as one process"))
    return {k: v for k, v in given.items() if v is not None}


def joined(session, info):
    """After zt.shard joined and made the engine: torch.distributed's default group for a job
    launched by zerorun, unless the script made one (under torchrun or as a single process it
    exists already). The job is the rendezvous: rank 0 serves a TCPStore at its Gloo address on a
    port the system picks, and the engine's broadcast tells the others where."""
    rank, world = info["rank"], info["world_size"]
    if dist.is_initialized():
        check_group(rank, world)
        return
    if world == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return
    server = None
    if rank == 0:
        server = dist.TCPStore(info["peer_address"], 0, world, True, timeout=RENDEZVOUS_TIMEOUT,
                               wait_for_workers=False)
    # The address as bytes in fp32 words, which a broadcast copies without arithmetic.
    raw = torch.zeros(256, dtype=torch.uint8)
    if server is not None:
        text = json.dumps([info["peer_address"], server.port]).encode()
        raw[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    words = raw.view(torch.float32)
    session.broadcast(words.data_ptr(), words.numel(), 0)
    host, port = json.loads(bytes(raw.tolist()).rstrip(b"\0").decode())
    store = server or dist.TCPStore(host, port, world, False, timeout=RENDEZVOUS_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=RENDEZVOUS_TIMEOUT)


def left():
    """zt.shutdown (or the exit) left the job."""
    if _state is not None:
        _state.left()


def rank():
    """This process's rank before it joins: $ZEROD_RANK (zerorun), $RANK (torchrun), else 0."""
    launch = _current()
    if launch.kind != "zerorun":
        return launch.rank
    return _zerorun_value("ZEROD_RANK", 0)


def world_size():
    """The job's size before joining: $ZEROD_WORLD_SIZE (zerorun), $WORLD_SIZE (torchrun), else
    1."""
    launch = _current()
    if launch.kind != "zerorun":
        return launch.world
    return _zerorun_value("ZEROD_WORLD_SIZE", 1)


def _zerorun_value(name, low):
    if name not in os.environ:
        raise ZerodError(FAILED_PRECONDITION, (
            f"zerod: {name} is not set and zt.shard has not joined a job yet (the coordinator "
            "assigns it at the join): set it as zerorun does, or call zt.shard first"))
    return _env_int(name, low)


def process_group():
    """torch.distributed's default process group: the job's ranks, gloo unless the script made
    its own group. zt.shard makes it when the script has not; under torchrun and as a single
    process this makes it before zt.shard too (the rendezvous zt.shard then uses)."""
    launch = _current()
    if not dist.is_initialized():
        if launch.kind == "zerorun":
            raise ZerodError(FAILED_PRECONDITION, (
                "zt.process_group: under zerorun the group is made when zt.shard joins the job "
                "(the job is its rendezvous): call zt.shard first"))
        launch.ensure_group()
    return dist.group.WORLD
