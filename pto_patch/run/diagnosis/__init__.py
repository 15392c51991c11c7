"""Diagnosis: `doctor` (the stack, the devices, every op on every usable backend) and the Ascend release
pairs it checks (`ascend_pairs`)."""
