"""The kernel stages of the chunked gated delta rule, one module per stage; `gdn.backends.triton.chunk`
chains them into the forward and the backward."""
