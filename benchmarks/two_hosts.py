"""The sharded head's 2-rank step test across two "hosts": two network namespaces joined by a
veth pair, one ``torchrun --nnodes=2`` per namespace, rendezvous across them.

Needs root (``ip netns``). The addresses (10.77.0.1, 10.77.0.2) exist only inside the two
namespaces, which are removed afterwards whatever happens. Each rank runs the DDP invariant of
``tests/distributed/test_sharded_head.py`` (DDP + the sharded head on 2 ranks equals one
process on the concatenated batch, for every registered loss, float64 and float32) and writes
its result; the script prints both and exits non-zero unless both passed.

    sudo .venv/bin/python benchmarks/two_hosts.py [--losses arcface,curricularface] [--out DIR]

The worker half (``--worker``) is what torchrun starts inside each namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = ("mf-host0", "mf-host1")
ADDRESSES = ("10.77.0.1", "10.77.0.2")
LINKS = ("mf-veth0", "mf-veth1")
PORT = 29577


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _teardown() -> None:
    for namespace in NAMESPACES:
        _ip("netns", "del", namespace, check=False)


def _setup() -> None:
    _teardown()
    for namespace in NAMESPACES:
        _ip("netns", "add", namespace)
    _ip("link", "add", LINKS[0], "type", "veth", "peer", "name", LINKS[1])
    for namespace, link, address in zip(NAMESPACES, LINKS, ADDRESSES, strict=True):
        _ip("link", "set", link, "netns", namespace)
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", link)
        _ip("-n", namespace, "link", "set", link, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")


def _launch(node: int, losses: str, out: Path) -> subprocess.Popen:
    torchrun = Path(sys.executable).with_name("torchrun")
    environment = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": LINKS[node],
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "OMP_NUM_THREADS": "1",
    }
    command = [
        "ip", "netns", "exec", NAMESPACES[node],
        str(torchrun), "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}",
        f"--master_addr={ADDRESSES[0]}", f"--master_port={PORT}",
        str(Path(__file__).resolve()), "--worker", "--losses", losses, "--out", str(out),
    ]  # fmt: skip
    log = (out / f"host{node}.log").open("w")
    return subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT)


def _worker(losses: list[str], out: Path) -> None:
    import datetime

    import torch.distributed as dist
    from tests.distributed.test_sharded_head import _check_invariant

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    began = time.perf_counter()
    result = {"rank": rank, "world": world, "losses": losses, "passed": False}
    try:
        _check_invariant(rank, world, losses, "sgd")
        result["passed"] = True
    except AssertionError as error:
        result["error"] = str(error)
    result["seconds"] = round(time.perf_counter() - began, 2)
    result["address"] = ADDRESSES[int(os.environ.get("GROUP_RANK", rank))]
    (out / f"rank{rank}.json").write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()
    if not result["passed"]:
        raise SystemExit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--losses", default="", help="comma-separated (default: every loss)")
    parser.add_argument("--out", type=Path, default=Path("runs/two-hosts"))
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if not args.losses:
        sys.path.insert(0, str(ROOT / "src"))
        import marginface

        args.losses = ",".join(marginface.list_losses())
    losses = [name for name in args.losses.split(",") if name]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        _worker(losses, args.out)
        return 0
    if os.geteuid() != 0:
        print("two_hosts.py needs root (ip netns)", file=sys.stderr)
        return 2
    _setup()
    try:
        began = time.perf_counter()
        processes = [_launch(node, ",".join(losses), args.out) for node in (0, 1)]
        codes = [p.wait(timeout=args.timeout) for p in processes]
        elapsed = time.perf_counter() - began
    finally:
        _teardown()
    results = [json.loads(path.read_text()) for path in sorted(args.out.glob("rank*.json"))]
    for result in results:
        print(json.dumps(result))
    print(f"exit codes {codes}, {elapsed:.1f} s in all (logs: {args.out}/host*.log)")
    return 0 if codes == [0, 0] and len(results) == 2 and all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
