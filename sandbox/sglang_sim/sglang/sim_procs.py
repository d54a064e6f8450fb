"""The simulated server's processes, as SGLang's look from outside: each registers as a GPU
compute app for the nvidia-smi stand-in, scheduler children (SGLANG_SIM_ORPHAN), the rendezvous of
ranks across nodes at --dist-init-addr, and how a rank shuts down (launch_server.py's docstring
has the knobs)."""
import json
import logging
import os
import signal
import sys
import threading
import time

import setproctitle

log = logging.getLogger("sglang")
GPU_REGISTRY = os.environ.get("SGLANG_SIM_GPU_REGISTRY", "/run/sglang-sim/gpu")


def visible_gpus():
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [int(g) for g in visible.split(",") if g.strip()] if visible else [0]


def register_gpu(pid, label, rank=None):
    """What a CUDA context does for nvidia-smi: this pid now holds memory on every visible GPU
    (the server), or on its rank's GPU (a scheduler)."""
    os.makedirs(GPU_REGISTRY, exist_ok=True)
    gpus = visible_gpus()
    if rank is not None:
        gpus = [gpus[rank % len(gpus)]]
    with open(os.path.join(GPU_REGISTRY, "%d.json" % pid), "w") as f:
        json.dump({"pid": pid, "gpus": gpus, "label": label,
                   "used_memory": int(os.environ.get("SGLANG_SIM_GPU_MEM_MB", "1000"))}, f)


def spawn_scheduler(mode, rank, tp_size):
    pid = os.fork()
    if pid:
        return pid
    # The child: a "scheduler" process that outlives its parent (sglang #4080 and others).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "escape":
        # Leave the unit's cgroup as a process handed to another manager does: systemd moves it
        # into a scope of its own (StartTransientUnit with its PID, what logind does for a
        # session), and systemctl stop no longer reaches it.  The hardened unit's read-only
        # cgroup tree leaves this way open to a root service, as on a real host.
        import subprocess
        me = str(os.getpid())
        subprocess.run(["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))",
                        "sglang-sim-orphan-%s.scope" % me, "fail", "1", "PIDs", "au", "1", me, "0"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
    # SGLang's own title (srt/managers/scheduler.py): the rank suffix only when tp_size > 1.
    title = "sglang::scheduler" + ("_TP%d" % rank if tp_size > 1 else "")
    setproctitle.setproctitle(title)
    register_gpu(os.getpid(), title, rank)
    while True:
        time.sleep(3600)


def shut_down_after(node_rank):
    """Exit after SGLANG_SIM_STOP_SECONDS with SGLANG_SIM_STOP_EXIT's status, 0 unless set (a rank
    > 0's SIGTERM handler, and the end of rank 0's drain); the join's watch threads keep running
    meanwhile."""
    seconds = os.environ.get("SGLANG_SIM_STOP_SECONDS", "0").split(",")
    codes = os.environ.get("SGLANG_SIM_STOP_EXIT", "0").split(",")

    def shut_down(*_):
        time.sleep(float(seconds[min(node_rank, len(seconds) - 1)]))
        code = int(codes[min(node_rank, len(codes) - 1)])
        if code:
            log.error("RuntimeError: an exception while shutting down (the sandbox's knob "
                      "SGLANG_SIM_STOP_EXIT): exiting with status %d", code)
        os._exit(code)
    return shut_down


def join(args):
    """Across nodes, as torch.distributed's rendezvous does at --dist-init-addr: rank 0 waits until
    every other rank has joined; afterwards, any rank that goes takes the others down with it (a
    NCCL communicator does not survive a lost peer)."""
    import socket
    host, port = args.dist_init_addr.rsplit(":", 1)

    def watch(conn, who):
        try:
            conn.recv(1)  # nothing is ever sent: returns when the peer is gone
        except OSError:
            pass
        if os.environ.get("SGLANG_SIM_PEER_LOSS") == "hang":
            log.warning("%s left the communicator; waiting in a collective", who)
            return
        log.error("RuntimeError: NCCL error: %s left the communicator (connection to %s closed)", who,
                  args.dist_init_addr)
        os._exit(1)
    if args.node_rank == 0:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", int(port)))
        listener.listen(args.nnodes)
        log.info("Waiting for %d other node(s) to join at %s", args.nnodes - 1, args.dist_init_addr)
        for _ in range(args.nnodes - 1):
            conn, peer = listener.accept()
            rank = conn.recv(8).decode().strip()
            log.info("Node rank %s joined from %s", rank, peer[0])
            threading.Thread(target=watch, args=(conn, "node rank " + rank), daemon=True).start()
        listener.close()  # the group is complete: a rank that comes later finds no rendezvous here
        return
    deadline = time.time() + float(os.environ.get("SGLANG_SIM_JOIN_TIMEOUT", "600"))
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                log.error("RuntimeError: could not reach rank 0 at %s", args.dist_init_addr)
                sys.exit(1)
            time.sleep(0.5)
    conn.settimeout(None)
    conn.sendall(b"%-8d" % args.node_rank)
    log.info("Joined rank 0 at %s as node rank %d", args.dist_init_addr, args.node_rank)
    threading.Thread(target=watch, args=(conn, "node rank 0"), daemon=True).start()
