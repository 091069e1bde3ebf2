"""Convolutional VAE on raw-count grayscale STEM sub-images: the training loss is nan from epoch 1.

Reproduces https://github.com/pycroscopy/atomai/issues/85 ("NaN VAE training loss when using
convolutional encoder and decoder"): a VAE trained on grayscale image data reports nan for every
entry of the training-loss history once conv_encoder / conv_decoder are switched on.  The
maintainer's answer: "Sometimes this can be due to data being not normalized. Can you try
normalizing it or doing z-standardization"; the reporter confirmed "Normalizing to [0,1] fixed
the nan issue."

This script rebuilds the same model in plain PyTorch (atomai-style conv encoder with leaky-ReLU
conv layers and two linear heads for z_mean / z_logsd, conv decoder, ELBO = 0.5 * summed squared
error + KL(N(mu, sd) || N(0, 1)), Adam lr 1e-4).  The sub-images are cut from a uint16 detector
image stack and fed as raw counts (about 540..3800): the first loss is ~6e8 and, because the
unbounded conv features are in the thousands, the first Adam step moves the z_logsd head to ~190;
exp(z_logsd) overflows float32, the sampled z and the reconstruction become inf and the loss is
nan from the second iteration on (every epoch prints nan).  The fully-connected encoder of atomai
squashes its features with tanh, which is why only the conv version showed it.

Fix: scale the image stack to [0, 1] (or z-standardise it) before training.
"""
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
np.random.seed(0)

WINDOW = 24
LATENT_DIM = 2
EPOCHS = 8
BATCH_SIZE = 32


def make_stem_stack(n_frames=4, size=96, spacing=8.0):
    """Synthetic HAADF-STEM movie as saved by the detector (uint16 counts): a square lattice of
    atomic columns with a few vacancies."""
    yy, xx = np.mgrid[0:size, 0:size]
    frames, centers = [], []
    for f in range(n_frames):
        img = np.full((size, size), 610.0)
        drift = np.random.uniform(-1.0, 1.0, size=2)
        for cy in np.arange(spacing / 2, size, spacing):
            for cx in np.arange(spacing / 2, size, spacing):
                if np.random.rand() < 0.05:          # vacancy
                    continue
                y0, x0 = cy + drift[0], cx + drift[1]
                amp = np.random.uniform(2400, 3200)
                img += amp * np.exp(-((yy - y0) ** 2 + (xx - x0) ** 2) / (2 * 1.6 ** 2))
                if WINDOW / 2 <= y0 < size - WINDOW / 2 and WINDOW / 2 <= x0 < size - WINDOW / 2:
                    centers.append((f, y0, x0))
        img = np.random.poisson(img).astype(np.float64)
        frames.append(np.clip(img, 0, 65535).astype(np.uint16))
    return np.stack(frames), centers


def extract_subimages(imgdata, centers, window):
    half = window // 2
    subimgs = []
    for f, y, x in centers:
        y, x = int(round(y)), int(round(x))
        subimgs.append(imgdata[f, y - half:y + half, x - half:x + half])
    return np.stack(subimgs)


class ConvBlock(nn.Module):
    def __init__(self, nlayers, input_channels, output_channels, lrelu_a=0.1):
        super().__init__()
        layers = []
        for i in range(nlayers):
            cin = input_channels if i == 0 else output_channels
            layers += [nn.Conv2d(cin, output_channels, 3, padding=1), nn.LeakyReLU(lrelu_a)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return self.block(x)


class ConvEncoderNet(nn.Module):
    def __init__(self, in_dim, latent_dim=2, num_layers=2, hidden_dim=32):
        super().__init__()
        self.conv = ConvBlock(num_layers, 1, hidden_dim)
        self.reshape_ = hidden_dim * in_dim[0] * in_dim[1]
        self.fc11 = nn.Linear(self.reshape_, latent_dim)
        self.fc12 = nn.Linear(self.reshape_, latent_dim)

    def forward(self, x):
        x = self.conv(x.unsqueeze(1))
        x = x.reshape(-1, self.reshape_)
        return self.fc11(x), self.fc12(x)


class ConvDecoderNet(nn.Module):
    def __init__(self, out_dim, latent_dim=2, num_layers=2, hidden_dim=32):
        super().__init__()
        self.fc_linear = nn.Linear(latent_dim, hidden_dim * out_dim[0] * out_dim[1], bias=False)
        self.reshape_ = (hidden_dim, *out_dim)
        self.decoder = ConvBlock(num_layers, hidden_dim, hidden_dim)
        self.conv_1x1 = nn.Conv2d(hidden_dim, 1, 1)

    def forward(self, z):
        h = self.fc_linear(z).reshape(-1, *self.reshape_)
        return self.conv_1x1(self.decoder(h)).squeeze(1)


def vae_loss(x, x_reconstr, z_mean, z_logsd):
    batch_dim = x.size(0)
    reconstr = 0.5 * torch.sum((x_reconstr.reshape(batch_dim, -1) - x.reshape(batch_dim, -1)) ** 2, 1)
    z_sd = torch.exp(z_logsd)
    kl = torch.sum(-z_logsd + 0.5 * z_sd ** 2 + 0.5 * z_mean ** 2 - 0.5, -1)
    return reconstr.mean() + kl.mean()


def main():
    imgdata, centers = make_stem_stack()
    subimgs = extract_subimages(imgdata, centers, WINDOW)
    train_data = torch.from_numpy(subimgs.astype(np.float32))
    print("training data:", tuple(train_data.shape), "intensity range", train_data.min().item(), train_data.max().item())

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train_data), batch_size=BATCH_SIZE, shuffle=True, drop_last=True)

    encoder = ConvEncoderNet((WINDOW, WINDOW), LATENT_DIM)
    decoder = ConvDecoderNet((WINDOW, WINDOW), LATENT_DIM)
    optimizer = torch.optim.Adam(list(decoder.parameters()) + list(encoder.parameters()), lr=1e-4)

    loss_history = []
    for epoch in range(EPOCHS):
        encoder.train()
        decoder.train()
        epoch_loss, n = 0.0, 0
        for (x,) in loader:
            z_mean, z_logsd = encoder(x)
            z = z_mean + torch.exp(z_logsd) * torch.randn_like(z_mean)
            x_reconstr = decoder(z)
            loss = vae_loss(x, x_reconstr, z_mean, z_logsd)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item() * x.size(0)
            n += x.size(0)
        loss_history.append(epoch_loss / n)
        print("Epoch: {}/{}, Training loss: {:.4f}".format(epoch + 1, EPOCHS, loss_history[-1]))
    print("train loss history:", np.array(loss_history))


if __name__ == "__main__":
    main()
