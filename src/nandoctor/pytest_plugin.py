"""`pytest --nandoctor`: fail any test in which a NaN/Inf is born and reaches a loss, a gradient
or a parameter, with the op, module, line and why (registered through the pytest11 entry point;
inert without the flag)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("nandoctor")
    group.addoption(
        "--nandoctor",
        action="store_true",
        default=False,
        help="fail tests in which a NaN/Inf reaches a loss, a gradient or a parameter",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not item.config.getoption("nandoctor"):
        return (yield)
    from nandoctor.api import guard

    with guard():
        return (yield)
