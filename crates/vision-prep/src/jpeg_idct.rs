//! The reconstruction of a baseline JPEG's rows from its coefficients, byte for byte as
//! libjpeg-turbo's decode (to be written).
