"""Test certificates: a CA and a server certificate for 127.0.0.1 and localhost, by openssl."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certificates(directory: Path) -> Path:
    """Write ``ca.pem``/``ca.key`` and ``server.pem``/``server.key`` (signed by the CA, for
    IP 127.0.0.1 and DNS localhost, valid two days) into ``directory``; return it."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=trio-coord test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=localhost")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2",
            "-extfile", "san.ext")  # fmt: skip
    return directory
