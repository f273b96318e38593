/* Vision projectors (gemma3). Not built yet: issue 34. */
#include "media/media-impl.h"

pkv_status pkv_mmproj_vision_open(pkv_mmproj *p, const char *projector, const pkv_model *text_model) {
    (void)p;
    (void)text_model;
    return pkv_err(PKV_ERR_UNSUPPORTED, "vision projector '%s' is not supported yet", projector);
}
