//! `colibri-lnet-node`: one LNet node as a process (work in progress).

fn main() {}
