"""Pretrained model definitions written with zeptograd's Tensor (imported on demand, not by `import zeptograd`)."""
