"""The PyTorch port: torch's `GradScaler` (torch.cuda.amp, torch.amp) -> npu_lossscale.torch's.

`names` says which qualified names are torch's scalers, `analysis` finds their uses and decides
each one into a `plan`, `arguments` maps a call's arguments onto the ported signature, `imports`
names the ported class and places its import, and `rewrite` applies the plan. Device strings and
autocast are left to torch-npu's `transfer_to_npu`; the port says so in its report.
"""
