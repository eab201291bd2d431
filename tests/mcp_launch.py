"""``python tests/mcp_launch.py SOCKET SCRIPT ARGS...`` (or ``SOCKET -c CODE``): a stdio MCP
server, as ``python SCRIPT ARGS...`` would be, forked by the fork server listening on SOCKET
(``tests/mcp_forks.py``) to serve on this process's stdin and stdout. This process exits
with the server's exit code when it ends; killed, it takes the server with it. It imports
nothing of the SDK: it costs what a bare interpreter does to start."""

from __future__ import annotations

import json
import os
import socket
import sys


def main() -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    socket.send_fds(sock, [json.dumps(sys.argv[2:]).encode()], [0, 1, 2])
    # The server alone holds the pipes now: its end is the end of the stream the reader sees.
    os.close(0)
    os.close(1)
    answers = sock.makefile("rb")
    answers.readline()  # the server's pid
    ended = answers.readline().strip()
    code = int(ended) if ended else 1
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
