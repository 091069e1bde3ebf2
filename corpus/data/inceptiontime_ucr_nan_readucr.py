"""InceptionTime on a UCR-2018-style archive whose series contain missing values.

Setting: the InceptionTime code base (hfawaz/InceptionTime) reads every UCR dataset with a
small helper, ``readucr``, that calls ``np.loadtxt`` on the ``<name>_TRAIN`` file and splits the
label column from the values.  ``main.py`` then one-hot encodes the labels, adds a channel axis
and hands the arrays to ``Classifier_INCEPTION.fit`` (Inception modules with bottlenecks,
BatchNorm, residual shortcuts every 3 modules, GAP, softmax; Adam; categorical cross-entropy).
There is no z-normalisation or cleaning step between the loader and the network.

Bug: a few datasets of the 2018 archive (DodgersLoopDay, DodgersLoopGame, MelbournePedestrian,
...) store missing samples as the token ``NaN``.  ``np.loadtxt`` parses them silently into
float NaN, so a handful of training series carry NaN stretches (sensor outages here).  Training
looks normal until the first mini-batch that contains one of those series: its BatchNorm
statistics, the loss and every gradient become NaN, Adam writes NaN into all weights and the
loss stays NaN for the rest of the run.

Report: https://github.com/hfawaz/InceptionTime/issues/50 ("NaN value handling": on
DodgersLoopDay "all the values within the model including the outputs becoming NaN").
Fix (the reply in the thread, which reproduced the published results): zero-impute the missing
values inside ``readucr`` when the file is parsed, e.g.
``data = np.nan_to_num(np.loadtxt(filename, delimiter=delimiter))``.
"""
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ARCHIVE_NAME = 'UCRArchive_2018'
DATASET_NAME = 'DodgersLoopDay'


def readucr(filename, delimiter='\t'):
    data = np.loadtxt(filename, delimiter=delimiter)
    Y = data[:, 0]
    X = data[:, 1:]
    return X, Y


def create_directory(directory_path):
    if os.path.exists(directory_path):
        return None
    os.makedirs(directory_path)
    return directory_path


def transform_labels(y_train, y_test):
    # make the min to zero of labels
    encoded = np.concatenate((y_train, y_test), axis=0)
    _, new_y = np.unique(encoded, return_inverse=True)
    return new_y[:len(y_train)], new_y[len(y_train):]


def write_fake_archive(root_dir, n_train=224, n_test=70, length=96, seed=7):
    """Stand-in for the downloaded archive: loop-sensor car counts, one class per weekday,
    15-minute bins over a day, written exactly like the UCR .tsv files (label first)."""
    rng = np.random.RandomState(seed)
    out = os.path.join(root_dir, 'archives', ARCHIVE_NAME, DATASET_NAME)
    create_directory(out)
    t = np.linspace(0, 1, length)
    profiles = []
    for c in range(7):
        morning = np.exp(-((t - (0.25 + 0.04 * c)) / 0.06) ** 2) * (1.0 if c < 5 else 0.3)
        evening = np.exp(-((t - (0.75 - 0.03 * c)) / 0.08) ** 2) * (0.6 + 0.1 * c)
        profiles.append(10 + 25 * morning + 20 * evening)
    for split, n in (('TRAIN', n_train), ('TEST', n_test)):
        labels = rng.randint(1, 8, size=n)
        rows = []
        for i, lab in enumerate(labels):
            series = profiles[lab - 1] + rng.normal(0, 2.0, size=length)
            cells = ['%.1f' % v for v in series]
            if split == 'TRAIN' and i in (113, 137, 190):     # loop detector outage
                start = rng.randint(10, length - 40)
                for j in range(start, start + 30):
                    cells[j] = 'NaN'
            rows.append('\t'.join([str(lab)] + cells))
        with open(os.path.join(out, '%s_%s.tsv' % (DATASET_NAME, split)), 'w') as f:
            f.write('\n'.join(rows) + '\n')


def read_all_datasets(root_dir, archive_name):
    datasets_dict = {}
    root_dir_dataset = os.path.join(root_dir, 'archives', archive_name, DATASET_NAME)
    file_name = os.path.join(root_dir_dataset, DATASET_NAME)
    x_train, y_train = readucr(file_name + '_TRAIN.tsv')
    x_test, y_test = readucr(file_name + '_TEST.tsv')
    datasets_dict[DATASET_NAME] = (x_train.copy(), y_train.copy(), x_test.copy(), y_test.copy())
    return datasets_dict


class InceptionModule(nn.Module):
    def __init__(self, in_channels, nb_filters, kernel_size, bottleneck_size, use_bottleneck):
        super().__init__()
        self.use_bottleneck = use_bottleneck and in_channels > 1
        width = bottleneck_size if self.use_bottleneck else in_channels
        if self.use_bottleneck:
            self.bottleneck = nn.Conv1d(in_channels, bottleneck_size, 1, bias=False)
        kernel_size_s = [(kernel_size // (2 ** i)) // 2 * 2 + 1 for i in range(3)]  # odd: same padding
        self.convs = nn.ModuleList([nn.Conv1d(width, nb_filters, k, padding='same', bias=False)
                                    for k in kernel_size_s])
        self.max_pool = nn.MaxPool1d(3, stride=1, padding=1)
        self.conv_6 = nn.Conv1d(in_channels, nb_filters, 1, bias=False)
        self.bn = nn.BatchNorm1d(4 * nb_filters)

    def forward(self, x):
        inp = self.bottleneck(x) if self.use_bottleneck else x
        out = [conv(inp) for conv in self.convs] + [self.conv_6(self.max_pool(x))]
        return torch.relu(self.bn(torch.cat(out, dim=1)))


class InceptionNet(nn.Module):
    def __init__(self, in_channels, nb_classes, nb_filters, depth, kernel_size,
                 use_residual=True, use_bottleneck=True, bottleneck_size=16):
        super().__init__()
        self.depth = depth
        self.use_residual = use_residual
        self.modules_ = nn.ModuleList()
        self.shortcuts = nn.ModuleList()
        channels, res_channels = in_channels, in_channels
        for d in range(depth):
            self.modules_.append(InceptionModule(channels, nb_filters, kernel_size,
                                                 bottleneck_size, use_bottleneck))
            channels = 4 * nb_filters
            if use_residual and d % 3 == 2:
                self.shortcuts.append(nn.Sequential(nn.Conv1d(res_channels, channels, 1, bias=False),
                                                    nn.BatchNorm1d(channels)))
                res_channels = channels
        self.fc = nn.Linear(channels, nb_classes)

    def forward(self, x):
        input_res = x
        s = 0
        for d in range(self.depth):
            x = self.modules_[d](x)
            if self.use_residual and d % 3 == 2:
                x = torch.relu(self.shortcuts[s](input_res) + x)
                input_res = x
                s += 1
        gap_layer = x.mean(dim=2)
        return self.fc(gap_layer)


class Classifier_INCEPTION:

    def __init__(self, output_directory, input_shape, nb_classes, verbose=True, batch_size=16,
                 nb_filters=8, use_residual=True, use_bottleneck=True, depth=3, kernel_size=21,
                 nb_epochs=2):
        self.output_directory = output_directory
        self.batch_size = batch_size
        self.nb_epochs = nb_epochs
        self.verbose = verbose
        self.model = InceptionNet(input_shape[-1], nb_classes, nb_filters, depth, kernel_size - 1,
                                  use_residual, use_bottleneck)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.001)
        self.reduce_lr = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, factor=0.5,
                                                                    patience=50, min_lr=0.0001)

    def fit(self, x_train, y_train, x_val, y_val, y_true):
        # keras Conv1D is channels-last, torch is channels-first
        x = torch.tensor(x_train, dtype=torch.float32).permute(0, 2, 1)
        y = torch.tensor(y_train.argmax(axis=1), dtype=torch.long)
        loader = DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
        criterion = nn.CrossEntropyLoss()
        start_time = time.time()
        step = 0
        for epoch in range(self.nb_epochs):
            self.model.train()
            epoch_loss, correct = 0.0, 0
            for xb, yb in loader:
                self.optimizer.zero_grad()
                logits = self.model(xb)
                loss = criterion(logits, yb)
                loss.backward()
                self.optimizer.step()
                step += 1
                epoch_loss += loss.item() * len(xb)
                correct += (logits.argmax(1) == yb).sum().item()
                if self.verbose:
                    print('step %d - loss: %.4f' % (step, loss.item()))
            epoch_loss /= len(x)
            self.reduce_lr.step(epoch_loss)
            print('Epoch %d/%d - loss: %.4f - accuracy: %.4f'
                  % (epoch + 1, self.nb_epochs, epoch_loss, correct / len(x)))
        duration = time.time() - start_time
        y_pred = self.predict(x_val)
        acc = float((y_pred == y_true).mean())
        print('test accuracy: %.4f  (duration %.1fs)' % (acc, duration))
        return acc

    def predict(self, x_test):
        self.model.eval()
        with torch.no_grad():
            x = torch.tensor(x_test, dtype=torch.float32).permute(0, 2, 1)
            return self.model(x).argmax(1).numpy()


def prepare_data():
    x_train = datasets_dict[dataset_name][0]
    y_train = datasets_dict[dataset_name][1]
    x_test = datasets_dict[dataset_name][2]
    y_test = datasets_dict[dataset_name][3]

    nb_classes = len(np.unique(np.concatenate((y_train, y_test), axis=0)))

    y_train, y_test = transform_labels(y_train, y_test)
    y_true = y_test.astype(np.int64)

    # transform the labels from integers to one hot vectors
    y_train = np.eye(nb_classes)[y_train]
    y_test = np.eye(nb_classes)[y_test]

    if len(x_train.shape) == 2:  # if univariate
        x_train = x_train.reshape((x_train.shape[0], x_train.shape[1], 1))
        x_test = x_test.reshape((x_test.shape[0], x_test.shape[1], 1))

    return x_train, y_train, x_test, y_test, y_true, nb_classes


def fit_classifier():
    input_shape = x_train.shape[1:]
    classifier = Classifier_INCEPTION(output_directory, input_shape, nb_classes)
    classifier.fit(x_train, y_train, x_test, y_test, y_true)


############################################### main
torch.manual_seed(0)
torch.set_num_threads(2)
root_dir = tempfile.mkdtemp(prefix='ucr_')
write_fake_archive(root_dir)

classifier_name = 'inception'
dataset_name = DATASET_NAME
print('\t\t\t\tdataset_name: ', dataset_name)

datasets_dict = read_all_datasets(root_dir, ARCHIVE_NAME)
x_train, y_train, x_test, y_test, y_true, nb_classes = prepare_data()
output_directory = os.path.join(root_dir, 'results', classifier_name, ARCHIVE_NAME, dataset_name) + '/'
create_directory(output_directory)

fit_classifier()
print('\t\t\t\tDONE')
sys.stdout.flush()
