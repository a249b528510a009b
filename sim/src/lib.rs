//! `ft-sim`: the discrete-event simulator.
