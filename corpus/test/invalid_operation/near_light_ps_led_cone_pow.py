"""Near-light photometric stereo: depth-map optimisation with anisotropic (tilted) LEDs.

Reported in hiroaki-santo/deep-near-light-photometric-stereo#1 ("light mu factor can go nan",
https://github.com/hiroaki-santo/deep-near-light-photometric-stereo/issues/1): in
``NearLightPS._light_radiant`` the LED radiance is ``torch.pow(dot, S_mu)`` with
``dot = <S_dir, -light_direction>``; "it is needed to add something like 'dot =
torch.clamp(1e-5, 1.)' to avoid having a negative power (it can very well happen for points far
away from the center of the image if S_dir is not [0,0,1]) to cause a nan to occur that would
crash ttraning [sic]".

Here the rig is eight LEDs on a ring in front of the lens, each tilted inwards towards the
object, with the anisotropy mu = -log 2 / log cos(50 deg) ~ 1.57 (not an integer).  The depth
map starts as a plane at a rough working distance; the optimisation pushes the backdrop pixels
back towards their true depth, and after 60 iterations the bottom-left corner pixel has moved
behind the emission plane of the LED on that side of the ring (the true backdrop corner lies
outside that LED's cone and is dark in its image): dot < 0, a negative base to a fractional
power is NaN in the forward pass, and ``Mest.max()`` spreads it to the whole loss (nan from
epoch 5 on, the depth map is NaN after the next step).
Fix (commit "fix #1"): ``dot = torch.clamp(dot, 1e-12, 1.)`` before the ``torch.pow``.
"""
import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(0)
np.random.seed(0)

IMG_SIZE = 48
FOCAL_LENGTH = 4.0                  # mm
PIXEL_MM = (0.1, 0.1)               # mm per pixel on the sensor (after 4x binning)
LED_HALF_ANGLE = np.deg2rad(50.)    # from the LED datasheet


def led_rig(light_num=8, ring_radius=80., ring_z=90., aim_z=140.):
    """LED positions S (mm, camera frame), principal directions, anisotropy mu, intensities."""
    ang = np.arange(light_num) * 2 * np.pi / light_num
    S = np.stack([ring_radius * np.cos(ang), ring_radius * np.sin(ang), np.full(light_num, ring_z)], axis=1)
    S_dir = np.array([0., 0., aim_z]) - S          # every LED is tilted towards the object
    S_dir /= np.linalg.norm(S_dir, axis=1, keepdims=True)
    mu = -np.log(2) / np.log(np.cos(LED_HALF_ANGLE))
    S_mu = np.full((light_num, 1), mu)
    S_phi = np.random.uniform(0.9, 1.1, size=(light_num, 1))
    return S, S_dir, S_mu, S_phi


def sensor_grid(m, n):
    camera_center = ((m - 1) / 2., (n - 1) / 2.)
    xx, yy = np.meshgrid(np.arange(n), np.arange(m))
    xx = -abs(PIXEL_MM[0]) * (camera_center[1] - xx)
    yy = abs(PIXEL_MM[1]) * (camera_center[0] - yy)
    return np.stack([xx, yy])


def capture_images(S, S_dir, S_mu, S_phi, m=IMG_SIZE, n=IMG_SIZE):
    """Stand-in for the real captures: a plaster dome in front of a grey backdrop."""
    xy = sensor_grid(m, n)
    wall = 155.
    r = np.hypot(xy[0], xy[1]) / FOCAL_LENGTH * 120.
    depth = np.where(r < 35., wall - np.sqrt(np.clip(35. ** 2 - r ** 2, 0, None)), wall)
    albedo = np.where(r < 35., 0.8, 0.4) * np.random.uniform(0.95, 1.05, size=(m, n))

    P = np.concatenate([depth / FOCAL_LENGTH * xy, depth[None]], axis=0)
    gy, gx = np.gradient(P, axis=(1, 2))
    N = np.cross(gx, gy, axis=0)
    N /= np.linalg.norm(N, axis=0, keepdims=True)

    M = []
    for s, d, mu, phi in zip(S, S_dir, S_mu, S_phi):
        L = s[:, None, None] - P
        dist = np.linalg.norm(L, axis=0)
        L /= dist
        cos_led = np.clip(np.sum(d[:, None, None] * -L, axis=0), 0., None)   # no light behind the LED
        shading = np.clip(np.sum(N * L, axis=0), 0., None)
        M.append(phi * cos_led ** mu * albedo * shading / dist ** 2)
    M = np.array(M)[..., None]
    M += np.random.normal(0, 0.003 * M.max(), M.shape)
    M = np.clip(M, 0, None)
    M /= M.max()
    return M.astype(np.float32), depth


class NearLightPS(torch.nn.Module):
    def __init__(self, M, S, S_dir, S_mu, S_phi, depth_init, lam=0.05):
        super(NearLightPS, self).__init__()
        light_num, m, n, ch = M.shape
        self.lam = lam
        self.register_buffer("M", torch.from_numpy(M))
        self.register_buffer("S", torch.from_numpy(S).float())
        self.register_buffer("S_dir", torch.from_numpy(S_dir).float())
        self.register_buffer("S_mu", torch.from_numpy(S_mu).float())
        self.register_buffer("S_phi", torch.from_numpy(S_phi).float())
        self.register_buffer("xy_on_sensor", torch.from_numpy(sensor_grid(m, n)).float())
        self.depth_map = torch.nn.Parameter(torch.from_numpy(depth_init).float())
        self.log_albedo = torch.nn.Parameter(torch.full((m, n), np.log(0.5), dtype=torch.float))

    def xy_map(self, depth_map):
        return depth_map / FOCAL_LENGTH * self.xy_on_sensor

    def _light_direction_per_pix(self, S):
        light_num = S.shape[0]
        m, n = self.depth_map.shape
        xyz = torch.cat([self.xy_map(self.depth_map), self.depth_map.reshape(1, m, n)], dim=0)
        light_directions = S.reshape(light_num, 3, 1, 1) - xyz.reshape(1, 3, m, n)   # surface to light
        light_distances = light_directions.norm(p=2, dim=1)
        light_directions = light_directions / (light_distances.unsqueeze(1) + 1e-12)
        return light_directions, light_distances

    @staticmethod
    def _light_radiant(S_dir, S_mu, light_directions):
        light_num, _, m, n = light_directions.shape
        dot = torch.sum(S_dir.reshape(light_num, 3, 1, 1) * -light_directions, dim=1)
        radiant = torch.pow(dot, S_mu.reshape(light_num, 1, 1).expand(light_num, m, n))
        return radiant

    def depth2normal(self, depth):
        m, n = depth.shape
        P = torch.cat([self.xy_map(depth), depth.reshape(1, m, n)], dim=0)
        P = F.pad(P.unsqueeze(0), (1, 1, 1, 1), mode="replicate")[0]
        gx = (P[:, 1:-1, 2:] - P[:, 1:-1, :-2]) / 2.
        gy = (P[:, 2:, 1:-1] - P[:, :-2, 1:-1]) / 2.
        return F.normalize(torch.cross(gx, gy, dim=0), p=2, dim=0)

    def forward(self, light_indices):
        M = self.M[light_indices]
        light_num, m, n, _ = M.shape
        light_directions, light_distances = self._light_direction_per_pix(self.S[light_indices])
        radiant = self._light_radiant(self.S_dir[light_indices], self.S_mu[light_indices], light_directions)
        radiant = self.S_phi[light_indices].reshape(light_num, 1, 1) * radiant

        N = self.depth2normal(self.depth_map)
        shading = torch.sum(N.unsqueeze(0) * light_directions, dim=1)
        Mest = radiant * self.log_albedo.exp() * torch.relu(shading) / light_distances ** 2
        Mest = Mest.unsqueeze(-1)

        Mest = Mest / Mest.max()  # to avoid overflow
        Mest = Mest / (2 * torch.sqrt(torch.mean(Mest ** 2)))
        M = M / (2 * torch.sqrt(torch.mean(M ** 2)))
        loss_m = torch.mean((Mest - M) ** 2)

        d = self.depth_map
        loss_s = torch.mean((d[1:, :] - d[:-1, :]) ** 2) + torch.mean((d[:, 1:] - d[:, :-1]) ** 2)
        return loss_m + self.lam * 1e-3 * loss_s, loss_m

    def minimize(self, optimizer, iter_in_loop, light_select_num):
        light_num = self.M.shape[0]
        for _ in range(iter_in_loop):
            indices = torch.randperm(light_num)[:light_select_num]
            loss, _ = self(indices)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def main(epochs=30, iter_in_loop=10, light_select_num=6, lr=1.0):
    S, S_dir, S_mu, S_phi = led_rig()
    M, depth_gt = capture_images(S, S_dir, S_mu, S_phi)
    light_num = M.shape[0]

    depth_init = np.ones(depth_gt.shape) * 105.   # rough working distance
    nps = NearLightPS(M, S, S_dir, S_mu, S_phi, depth_init)
    optimizer = torch.optim.Adam([
        {"params": [nps.depth_map]},
        {"params": [nps.log_albedo], "lr": 0.01},
    ], lr=lr)

    for epoch in range(epochs):
        nps.minimize(optimizer, iter_in_loop=iter_in_loop, light_select_num=light_select_num)
        with torch.no_grad():
            loss, loss_m = nps(torch.arange(light_num))
            mae = (nps.depth_map - torch.from_numpy(depth_gt).float()).abs().mean()
        print(f"epoch {epoch:3d}  loss {loss.item():.6f}  loss_m {loss_m.item():.6f}  "
              f"depth MAE {mae.item():.2f} mm")


if __name__ == "__main__":
    main()
