//! The front: a MongoDB wire-protocol server that applications reach with their own MongoDB
//! driver, as they reach a `mongos`. [`wire`] is its codec, pure: bytes in, typed requests out,
//! reply frames back, with every length and section checked before it is trusted.

pub mod wire;
