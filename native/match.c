/* Pattern matching in C: to be filled (issue 17). */
#include "native.h"

int
add_match_functions(PyObject *module)
{
    (void)module;
    return 0;
}
