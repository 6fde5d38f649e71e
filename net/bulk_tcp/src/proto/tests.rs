//! Unit tests of the protocol, on a manual clock.
