"""Checkpoints: reading safetensors and .pt files into shards (loader), writing them (writer), their
SHA256SUMS (digests), and the files users hand over (files)."""
