// kernsearch interpreter: Metal Performance Primitives (the subset in ks_mpp.h)
#include "../ks_mpp.h"
