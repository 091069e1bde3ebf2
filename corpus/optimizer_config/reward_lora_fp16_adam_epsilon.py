"""Step-2 reward-model finetuning (RLHF) in the style of pykoi's rlhf/rw_finetuning.py.

Setting: a small causal-LM backbone is "loaded" in torch.float16 (the config has bf16=False, so
the torch_dtype falls back to float16), LoRA adapters are put on the q/v projections the way
peft does it (lora_A random, lora_B zero, cast to the base weight's dtype) and the score head
is trained too.  A Trainer-like class builds AdamW from TrainingArguments and optimises the
InstructGPT pairwise loss -logsigmoid(r_chosen - r_rejected) on (question, better answer,
worse answer) triples (synthetic token ids here).

Bug: the adapters and the score head are float16 parameters, and the optimizer is built with
the Hugging Face default adam_epsilon=1e-8.  float16 cannot hold 1e-8 (its smallest subnormal
is ~6e-8), so `sqrt(v_hat) + eps` is computed as `sqrt(v_hat) + 0`.  Where the second moment is
zero - every lora_A entry on the first step, because lora_B starts at zero and so lora_A's
gradient is exactly 0, and any entry whose tiny gradient squares to 0 in float16 - the update is
0/0 = NaN (or m/0 = inf).  The parameters become NaN after the first optimizer step and every
later reward and loss is nan.

Fix (pykoi PR #69, commit 7241f6e "Fix the issue of parameters updated as nan in the reward
model training"): pass adam_epsilon=1e-7 to TrainingArguments - "torch.float16 will round any
number smaller than 6e-8 to 0.  Do not change epsilon to smaller than 6e-8."

Report: https://github.com/CambioML/pykoi/pull/69
"""
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LoraConfig:
    r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple = ("q_proj", "v_proj")


@dataclass
class RLHFConfig:
    seed: Optional[int] = field(default=0, metadata={"help": "Random seed."})
    vocab_size: Optional[int] = field(default=500, metadata={"help": "Toy tokenizer size."})
    per_device_train_batch_size: Optional[int] = field(default=8)
    learning_rate: Optional[float] = field(default=1e-5, metadata={"help": "Learning rate."})
    weight_decay: Optional[float] = field(default=0.01, metadata={"help": "Weight decay."})
    bf16: Optional[bool] = field(default=False, metadata={"help": "Enable BF16."})
    reward_num_of_data: Optional[int] = field(default=48)
    max_seq_length_reward: Optional[int] = field(default=24)
    reward_epochs: Optional[int] = field(default=2)
    logging_steps: Optional[int] = field(default=2)
    lora_config_reward: Optional[LoraConfig] = field(default_factory=LoraConfig)


@dataclass
class TrainingArguments:
    """The handful of transformers.TrainingArguments fields this script uses."""
    output_dir: str
    learning_rate: float
    per_device_train_batch_size: int
    num_train_epochs: int
    weight_decay: float
    logging_steps: int
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, attention_mask):
        B, T, D = x.shape
        h = self.ln_1(x)
        q = self.q_proj(h).view(B, T, self.n_head, -1).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.n_head, -1).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.n_head, -1).transpose(1, 2)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        keep = causal[None, None] & attention_mask[:, None, None, :].bool()
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~keep, -1e4).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.o_proj(y)
        return x + self.mlp(self.ln_2(x))


class ToyForSequenceClassification(nn.Module):
    """Stands in for AutoModelForSequenceClassification(num_labels=1)."""

    def __init__(self, vocab_size, d=48, n_layer=2, n_head=4, max_len=32):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d)
        self.wpe = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.score = nn.Linear(d, 1, bias=False)

    def forward(self, input_ids, attention_mask):
        pos = torch.arange(input_ids.shape[1])
        x = self.wte(input_ids) + self.wpe(pos)[None]
        for blk in self.blocks:
            x = blk(x, attention_mask)
        x = self.ln_f(x)
        last = attention_mask.sum(1) - 1                      # last non-pad token
        logits = self.score(x[torch.arange(x.shape[0]), last])
        return (logits.squeeze(-1),)


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, cfg: LoraConfig):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, cfg.r, bias=False)
        self.lora_B = nn.Linear(cfg.r, base.out_features, bias=False)
        self.lora_dropout = nn.Dropout(cfg.lora_dropout)
        self.scaling = cfg.lora_alpha / cfg.r
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        # like peft of that time: the adapter takes the base layer's device and dtype
        self.to(base.weight.device, dtype=base.weight.dtype)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def get_peft_model(model, cfg: LoraConfig):
    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for name in cfg.target_modules:
            setattr(blk, name, LoraLinear(getattr(blk, name), cfg))
    for p in model.score.parameters():          # modules_to_save for SEQ_CLS
        p.requires_grad_(True)
    return model


def print_trainable_parameters(model):
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    print(f"trainable params: {n_train} || all params: {n_all} || "
          f"trainable%: {100 * n_train / n_all:.2f}")


# ----------------------------------------------------------------------------- data
def make_ranking_dataset(cfg: RLHFConfig):
    """(question, better answer, worse answer) as token ids: the better answer re-uses the
    question's tokens, the worse one is random."""
    rng = np.random.default_rng(cfg.seed)
    data = []
    for _ in range(cfg.reward_num_of_data):
        q = rng.integers(1, cfg.vocab_size, size=rng.integers(4, 9))
        good = np.concatenate([q, rng.choice(q, size=rng.integers(4, 9))])
        bad = np.concatenate([q, rng.integers(1, cfg.vocab_size, size=rng.integers(4, 9))])
        data.append((q, good, bad))
    return data


def collate(batch, max_length):
    def pad(seqs):
        L = min(max(len(s) for s in seqs), max_length)
        ids = torch.zeros(len(seqs), L, dtype=torch.long)
        mask = torch.zeros(len(seqs), L, dtype=torch.long)
        for i, s in enumerate(seqs):
            s = s[:L]
            ids[i, :len(s)] = torch.as_tensor(s)
            mask[i, :len(s)] = 1
        return ids, mask

    ids_x, mask_x = pad([np.concatenate([q, g]) for q, g, _ in batch])
    ids_y, mask_y = pad([np.concatenate([q, b]) for q, _, b in batch])
    return {"input_ids_x": ids_x, "attention_mask_x": mask_x,
            "input_ids_y": ids_y, "attention_mask_y": mask_y}


# ----------------------------------------------------------------------------- trainer
class RewardFinetuning:
    def __init__(self, rlhf_config: RLHFConfig):
        self._rlhf_config = rlhf_config
        self.args = TrainingArguments(
            output_dir="step2_reward_finetuning",
            learning_rate=rlhf_config.learning_rate,
            per_device_train_batch_size=rlhf_config.per_device_train_batch_size,
            num_train_epochs=rlhf_config.reward_epochs,
            weight_decay=rlhf_config.weight_decay,
            logging_steps=rlhf_config.logging_steps,
            adam_epsilon=1e-8,
        )
        self.torch_dtype = torch.bfloat16 if rlhf_config.bf16 else torch.float16

        torch.manual_seed(rlhf_config.seed)
        self.base_model = ToyForSequenceClassification(rlhf_config.vocab_size).to(self.torch_dtype)
        self.model = get_peft_model(self.base_model, rlhf_config.lora_config_reward)
        print_trainable_parameters(self.model)
        self.dataset = make_ranking_dataset(rlhf_config)

    def create_optimizer(self):
        decay, no_decay = [], []
        for n, p in self.model.named_parameters():
            if p.requires_grad:
                (no_decay if n.endswith("bias") else decay).append(p)
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.args.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
        )

    # InstructGPT pairwise logloss
    def compute_loss(self, model, inputs):
        rewards_x = model(input_ids=inputs["input_ids_x"], attention_mask=inputs["attention_mask_x"])[0]
        rewards_y = model(input_ids=inputs["input_ids_y"], attention_mask=inputs["attention_mask_y"])[0]
        loss = -F.logsigmoid(rewards_x - rewards_y).mean()
        return loss, rewards_x, rewards_y

    def train(self):
        optimizer = self.create_optimizer()
        bs = self.args.per_device_train_batch_size
        rng = np.random.default_rng(self._rlhf_config.seed)
        global_step, t0 = 0, time.time()
        self.model.train()
        for epoch in range(self.args.num_train_epochs):
            order = rng.permutation(len(self.dataset))
            for i in range(0, len(order) - bs + 1, bs):
                inputs = collate([self.dataset[j] for j in order[i:i + bs]],
                                 self._rlhf_config.max_seq_length_reward)
                loss, rx, ry = self.compute_loss(self.model, inputs)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], self.args.max_grad_norm)
                optimizer.step()
                global_step += 1
                if global_step == 1 or global_step % self.args.logging_steps == 0:
                    acc = (rx > ry).float().mean().item()
                    print(f"{{'loss': {loss.item():.4f}, 'reward_acc': {acc:.3f}, "
                          f"'epoch': {epoch + i / len(order):.2f}, 'step': {global_step}}}")
        print(f"train_runtime: {time.time() - t0:.1f}s")

    def train_and_save(self):
        self.train()


if __name__ == "__main__":
    config = RLHFConfig()
    rewardTrainer = RewardFinetuning(config)
    rewardTrainer.train_and_save()
