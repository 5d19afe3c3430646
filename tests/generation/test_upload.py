"""The engine's host->device uploads (generation/scheduler.py): the same tensors `torch.tensor` builds.
On the CPU they are plain tensors; tests/generation/test_gpu.py checks the pinned, non-blocking CUDA path."""
import torch

from aioareal.generation.scheduler import upload, upload_padded

CPU = torch.device("cpu")


def test_upload_builds_the_same_tensors_as_torch_tensor():
    assert torch.equal(upload([3, 1, 2], CPU), torch.tensor([3, 1, 2]))
    assert upload([1], CPU).dtype == torch.long and upload([1.5], CPU, torch.float32).dtype == torch.float32
    assert torch.equal(upload_padded([[1, 2, 3], [4]], CPU), torch.tensor([[1, 2, 3], [4, 0, 0]]))
    assert torch.equal(upload_padded([[5], [6, 7]], CPU, pad=9), torch.tensor([[5, 9], [6, 7]]))
