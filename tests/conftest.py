import pytest

import tsl


@pytest.fixture(scope="session")
def cpu():
    return tsl.load_machine("x86-avx512")
