"""What do saving and resuming cost under each backend? `shardbench checkpoint-costs`; `export` (any backend's
checkpoint as one Hugging Face directory) and `pretrain` (a small pretrained checkpoint to fine-tune)."""
