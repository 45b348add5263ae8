"""`--engine`'s spellings of a Dask cluster: `dask://HOST:PORT` is Dask's `HOST:PORT` (TCP),
`dask+tls://HOST:PORT` its `tls://HOST:PORT`, and each choice's spec, which config.json
records, is the flag as given, without the client's credentials; anything else is refused."""

from __future__ import annotations

import pytest

from dpsynth.data.engines import DaskTLS, check_workers, parse_engine, with_tls
from dpsynth.errors import UsageError


def test_the_dask_spellings_round_trip() -> None:
    plain, tls = parse_engine("dask://head:8786"), parse_engine(" dask+tls://10.0.0.1:8786 ")
    assert (plain.address, plain.is_tls, plain.spec) == ("head:8786", False, "dask://head:8786")
    assert (tls.address, tls.is_tls) == ("tls://10.0.0.1:8786", True)
    assert tls.spec == "dask+tls://10.0.0.1:8786"
    for text in ("tls://head:8786", "dask+tls://head", "dask://tls://head:1", "dask+ssh://h:1"):
        with pytest.raises(UsageError):
            parse_engine(text)


def test_credentials_travel_with_the_choice_not_its_spec(tmp_path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read before connecting")
    choice = with_tls(parse_engine("dask+tls://head:8786"), ca, str(ca), None)
    assert choice.tls == DaskTLS(str(ca), str(ca), None)
    assert choice.spec == "dask+tls://head:8786" and str(ca) not in repr(choice)
    assert with_tls(parse_engine("duckdb"), None, None, None) == parse_engine("duckdb")
    with pytest.raises(UsageError) as refused:
        with_tls(parse_engine("dask://head:8786"), ca, None, None)
    assert refused.value.parameters[0] == "tls_ca_file"
    check_workers(3, parse_engine("auto"))  # auto may go out of core
    for workers, engine in ((0, "duckdb"), (True, "duckdb"), (2, "memory")):
        with pytest.raises(UsageError) as refused:
            check_workers(workers, parse_engine(engine))  # type: ignore[arg-type]
        assert refused.value.parameter == "workers"
