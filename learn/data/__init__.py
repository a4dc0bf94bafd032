"""The data makers of `learn/`: reading labelled lists, the simulated and stand-in recognisers, the corpus."""
