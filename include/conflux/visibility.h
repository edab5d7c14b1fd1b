#ifndef CONFLUX_VISIBILITY_H
#define CONFLUX_VISIBILITY_H

#if defined(CFX_BUILDING_LIBRARY) && defined(__GNUC__)
#define CFX_API __attribute__((visibility("default")))
#else
#define CFX_API
#endif

#endif
