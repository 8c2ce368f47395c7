/* placeholder until the CLI lands */
#include <stdio.h>
#include "ferry.h"
int main(void) { printf("ferry %s\n", ferry_version()); return 0; }
