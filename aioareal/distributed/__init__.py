"""Scale-out on torch.distributed (see README "Scaling out"): one cell per torchrun rank. Import the
submodules themselves: this package imports nothing, so that low layers (the trainer) can use
`reduce` without loading the checkpoint code that depends on them."""
