/*
 * Whether cowmap may use CPython's own object layouts and slots beyond the
 * public C API, for speed: the digits of an int (fastint.h), the value of a
 * float, and the allocation slots of the async layer's hot types
 * (untracked.h). Each such path has a public-API fallback that does the same
 * thing more slowly, and CM_CPYTHON_INTERNALS is 0 where the fast paths
 * cannot be trusted:
 *   - a build with COWMAP_PUBLIC_API_ONLY defined (the CMake option of that
 *     name), which forces every fallback so the test suite can run them on
 *     any interpreter;
 *   - a free-threaded interpreter (Py_GIL_DISABLED), whose objects are shared
 *     between threads without the GIL (cowmap refuses to import there anyway:
 *     python/cowmap/__init__.py);
 *   - the limited API, which hides the layouts.
 * Which CPython versions a fast path knows is decided next to it.
 */
#ifndef COWMAP_CPYTHON_INTERNALS_H
#define COWMAP_CPYTHON_INTERNALS_H

#include <Python.h>

#if defined(COWMAP_PUBLIC_API_ONLY) || defined(Py_GIL_DISABLED) || defined(Py_LIMITED_API)
#define CM_CPYTHON_INTERNALS 0
#else
#define CM_CPYTHON_INTERNALS 1
#endif

#endif
