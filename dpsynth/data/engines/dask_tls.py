"""A Dask cluster's address as `--engine` spells it, and a TLS client's credentials.

Dask names a scheduler `tcp://HOST:PORT` or `tls://HOST:PORT`; `--engine` says
`dask://HOST:PORT` and `dask+tls://HOST:PORT` (the `dask+` names the engine). Dask's TLS is
mutual: a client shows the cluster's CA and a certificate the cluster trusts, which
`distributed.security.Security` takes as files (`tls_ca_file`, `tls_client_cert`,
`tls_client_key`; `dask scheduler --tls-ca-file/--tls-cert/--tls-key` for the servers). A file
not given is read from Dask's own configuration (`distributed.comm.tls.ca-file`,
`.client.cert`, `.client.key`), as any Dask client reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsynth.errors import UsageError

TLS_PROTOCOL = "tls://"
_TLS_NAMES = ("engine", "tls_ca_file", "tls_cert", "tls_key")


@dataclass(frozen=True)
class DaskTLS:
    """A Dask client's TLS credentials as `distributed.security.Security` takes them: the
    cluster's CA file, the client's certificate and its key (None: the key is in the
    certificate's file). A field left None is taken from Dask's own configuration
    (`distributed.comm.tls.ca-file`, `.client.cert`, `.client.key`), as a Dask client does."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None


def dask_spec(address: str) -> str:
    """`--engine`'s spelling of a scheduler's address (`HOST:PORT` or `tls://HOST:PORT`)."""
    if address.startswith(TLS_PROTOCOL):
        return f"dask+tls://{address.removeprefix(TLS_PROTOCOL)}"
    return f"dask://{address}"


def dask_security(tls: DaskTLS | None) -> Any:
    """The `distributed.security.Security` of a TLS client: the given files, and Dask's own
    configuration for what is not given. UsageError, one line, when there is no CA or no
    client certificate (Dask's TLS is mutual: the client shows a certificate the cluster
    trusts) or a given file is missing."""
    from distributed.security import Security

    tls = tls or DaskTLS()
    files = (
        ("tls_ca_file", tls.ca_file),
        ("tls_client_cert", tls.cert),
        ("tls_client_key", tls.key),
    )
    given = {}
    for (name, path), parameter in zip(files, _TLS_NAMES[1:], strict=True):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{{{parameter}}} {path}: no such file", parameter=parameter)
        if path is not None:
            given[name] = str(path)
    security = Security(**given)
    if not (security.tls_ca_file and security.tls_client_cert):
        raise UsageError(
            "{engine} dask+tls://…: Dask's TLS is mutual and needs the cluster's CA "
            "({tls_ca_file}) and a client certificate it trusts ({tls_cert}, with {tls_key} "
            "unless the key is in that file), or Dask's configuration "
            "distributed.comm.tls.ca-file and distributed.comm.tls.client.cert",
            parameters=_TLS_NAMES,
        )
    return security
