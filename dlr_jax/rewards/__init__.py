"""Rewards: the answer and format rewards (`answer_format`) and the process-alignment reward (`process`)."""
