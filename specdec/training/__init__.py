"""Making a draft fit a target: vocabulary transplant, distillation, pruning."""
