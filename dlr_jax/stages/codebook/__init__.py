"""Stage 0, codebook construction: the stage (`stage`), its models, held-out evaluation, the pretrained
DeepSeek-OCR-2 path (`ocr2`) and the checkpoint report (`python -m dlr_jax.stages.codebook.report`)."""
