"""Text: the tokenizer wrapper and boundary tokens, answers, CoT rendering, OCR text targets."""
