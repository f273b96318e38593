#include <stdio.h>
#include "pagekv.h"
int main(void) { printf("%s\n", pkv_status_str(PKV_OK)); return 0; }
