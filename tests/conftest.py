import pytest
import torch


@pytest.fixture(autouse=True)
def seed():
    """Every test starts from the same RNG state."""
    torch.manual_seed(0)
    yield
