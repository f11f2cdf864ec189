"""Does the time model hold? `shardbench time-check` (measured steps part by part against the model),
`time-extrapolate` (runs it was not calibrated on), `device-costs` (this device's rates, collectives and host
costs, measured once; cold_start.py, device_costs_cuda.py) and `collectives` (bus bandwidth of each collective)."""
