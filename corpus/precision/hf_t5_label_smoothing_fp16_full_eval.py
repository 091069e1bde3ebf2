"""Toy "translation" with a small T5 trained by the Hugging Face Trainer.

Source sentences are random token sequences; the target is the sequence reversed.
The loss is fairseq-style label-smoothed cross-entropy, implemented in a Trainer
subclass. Evaluation runs the model in full fp16 (fp16_full_eval) to halve the
memory needed at inference time.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import T5Config, T5ForConditionalGeneration, Trainer, TrainingArguments

PAD_ID, EOS_ID = 0, 1


class ReversalDataset(Dataset):
    def __init__(self, n_pairs, src_len=12, n_symbols=400, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.src = torch.randint(3, 3 + n_symbols, (n_pairs, src_len), generator=g)

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        src = self.src[i]
        tgt = torch.cat([src.flip(0), torch.tensor([EOS_ID])])
        return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": tgt}


def label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=-100):
    target = target.unsqueeze(-1)
    pad_mask = target.eq(ignore_index)
    target = target.clamp(min=0)
    nll_loss = -lprobs.gather(dim=-1, index=target)
    smooth_loss = -lprobs.sum(dim=-1, keepdim=True)
    nll_loss = nll_loss.masked_fill(pad_mask, 0.0)
    smooth_loss = smooth_loss.masked_fill(pad_mask, 0.0)
    n_tokens = (~pad_mask).sum()
    nll_loss = nll_loss.sum() / n_tokens
    smooth_loss = smooth_loss.sum() / n_tokens
    eps_i = epsilon / lprobs.size(-1)
    return (1.0 - epsilon) * nll_loss + eps_i * smooth_loss


class LabelSmoothedTrainer(Trainer):
    def __init__(self, *args, smoothing=0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.smoothing = smoothing

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        outputs = model(**inputs)
        lprobs = F.log_softmax(outputs.logits, dim=-1)
        loss = label_smoothed_nll_loss(lprobs, labels, self.smoothing)
        return (loss, outputs) if return_outputs else loss


def build_model():
    config = T5Config(
        vocab_size=32128,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=PAD_ID,
    )
    return T5ForConditionalGeneration(config)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--no-fp16-eval", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = build_model()
    train_set = ReversalDataset(640, seed=0)
    valid_set = ReversalDataset(64, seed=1)

    training_args = TrainingArguments(
        output_dir="t5_reversal_out",
        use_cpu=True,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        learning_rate=args.lr,
        num_train_epochs=args.epochs,
        warmup_steps=10,
        logging_steps=10,
        eval_strategy="epoch",
        save_strategy="no",
        fp16_full_eval=not args.no_fp16_eval,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = LabelSmoothedTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=valid_set,
        smoothing=0.1,
    )
    trainer.train()
    metrics = trainer.evaluate()
    print(f"final eval loss: {metrics['eval_loss']:.4f}")


if __name__ == "__main__":
    main()
