"""`engram node-agent`: one per node, holding the node copies engines ask it for in the rendezvous
directory (engram.runtime.placement.node_agent), until stopped (SIGTERM or SIGINT)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from engram.commands import add_command
from engram.config import load_config
from engram.errors import EngramError


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "node-agent")
    parser.add_argument(
        "--node-dir",
        metavar="DIR",
        help="the rendezvous directory every engine's pod mounts (default $ENGRAM_NODE_DIR)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engram.runtime.placement.node_agent import NodeAgent

    given = args.node_dir or os.environ.get("ENGRAM_NODE_DIR")
    if not given:
        raise EngramError("engram node-agent needs the rendezvous directory: --node-dir DIR, or ENGRAM_NODE_DIR")
    node_dir = load_config({"node_sharing": "node", "node_dir": given}, env={}).node_dir  # checked as the field is
    assert node_dir is not None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    agent = NodeAgent(node_dir)
    print(f"engram node-agent: serving {node_dir} (pid {os.getpid()}, {len(agent.held)} copies taken on)", flush=True)
    try:
        agent.serve(stop)
    finally:
        agent.close()
    print(f"engram node-agent: stopped; the {len(agent.held)} copies it held live on in the engines that map them")
    return 0
