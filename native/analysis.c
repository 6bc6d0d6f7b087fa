/* The batching analysis in C: to be filled (issue 17). */
#include "native.h"

int
add_analysis_functions(PyObject *module)
{
    (void)module;
    return 0;
}
