"""NNCFUSE_LOG_LEVEL: a name that is no module's warns, once."""

import warnings

import pytest

from nncfuse import log


@pytest.fixture
def fresh_log():
    log._parse.cache_clear()
    log._warned.clear()
    yield
    log._parse.cache_clear()
    log._warned.clear()


def test_unknown_module_name_warns_once_naming_the_valid_ones(monkeypatch, fresh_log):
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "kernal:>>kernel")
    kernel = log.get_logger("nncfuse/tensorexpr/kernel.py")
    with pytest.warns(UserWarning, match="'kernal'") as record:
        assert kernel.enabled(log.DEBUG)  # the valid name still selects its module
    message = str(record[0].message)
    assert "kernel" in message.split("names are:")[1]
    assert "tensorexpr_fuser" in message and "llvm_codegen" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log._parse.cache_clear()  # parsed again: still no second warning
        assert kernel.enabled(log.DEBUG)


def test_module_names_are_the_package_basenames(monkeypatch, fresh_log):
    names = log.module_names()
    assert {"log", "kernel", "tensorexpr_fuser", "saved_writes", "entry"} <= names
    assert "__init__" not in names
    monkeypatch.setenv("NNCFUSE_LOG_LEVEL", "kernel.py:>tensorexpr_fuser")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert log.get_logger("kernel.py").enabled(log.DUMP)
