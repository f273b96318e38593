/* Compiled as strict C11 with only include/ on the path: pagekv.h stands alone. */
#include "pagekv.h"
int pkv_header_check_dummy(void);
int pkv_header_check_dummy(void) { return PKV_OK; }
