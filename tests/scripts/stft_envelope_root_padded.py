"""Planted bug: a spectral-envelope loss takes the square root of band energies with nothing
under the root, and the second clip is zero-padded: its bands have energy 0, where the
derivative of the root is infinite. The gradient reaches the model through the STFT's
backward, which copies it into a slice of a tensor of zeros before its inverse FFT."""

import torch

torch.manual_seed(0)
model = torch.nn.Conv1d(1, 1, 3, padding=1, bias=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
bands = torch.rand(15, 33)  # band matrix over the 33 frequency bins of a 64-point STFT
audio = torch.randn(2, 1, 512)
audio[1, :, 256:] = 0  # a short clip, zero-padded to the batch's length

for step in range(3):
    estimate = model(audio).squeeze(1)
    spec = torch.stft(estimate, n_fft=64, hop_length=32, window=torch.hann_window(64),
                      return_complex=True)  # fmt: skip
    envelope = torch.matmul(bands, spec.abs() ** 2).pow(0.5)
    loss = -envelope.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
