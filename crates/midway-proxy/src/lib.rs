//! midway-proxy
